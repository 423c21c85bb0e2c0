"""Redis counters: one EVALSHA per request covering all of its checks (one round trip).

redis-py's Script object does EVALSHA and reloads the script on NOSCRIPT by itself, so a
restarted or flushed Redis needs no handling here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from rls.backends.base import BackendError
from rls.backends.scripts import decide_script
from rls.engine.algorithms import ALGORITHM_IDS
from rls.engine.model import Check, Outcome, Verdict

_EPOCH = (0, 0, 0)


class RedisBackend:
    name = "redis"

    def __init__(
        self,
        url: str,
        *,
        timeout_ms: int = 50,
        connect_timeout_ms: int = 200,
        pool_size: int = 64,
    ) -> None:
        self.url = url
        self.client: Any = aioredis.from_url(
            url,
            socket_timeout=timeout_ms / 1000,
            socket_connect_timeout=connect_timeout_ms / 1000,
            max_connections=pool_size,
            retry_on_timeout=False,
        )
        self._script = self.client.register_script(decide_script())

    async def start(self) -> None:
        try:
            await self.client.ping()
        except (RedisError, OSError) as exc:
            # Not fatal: the service answers per its failure mode until Redis is back.
            raise BackendError(f"redis not reachable at start: {exc}") from exc

    async def close(self) -> None:
        await self.client.aclose()

    async def healthy(self) -> bool:
        try:
            return bool(await self.client.ping())
        except (RedisError, OSError):
            return False

    async def decide(self, checks: Sequence[Check], now_ms: int | None = None) -> Verdict:
        args: list[Any] = ["" if now_ms is None else now_ms]
        for c in checks:
            lim = c.limit
            args += [
                ALGORITHM_IDS[lim.algorithm],
                c.flags,
                c.hits,
                lim.requests_per_unit,
                lim.window_ms,
                lim.burst if lim.burst is not None else lim.requests_per_unit,
                lim.overdraft,
                *(c.bounds or _EPOCH),
            ]
        try:
            res = await self._script(keys=[c.key for c in checks], args=args)
        except (RedisError, OSError) as exc:
            raise BackendError(f"redis: {exc}") from exc
        outcomes = [
            Outcome(
                bool(res[o]), bool(res[o + 1]), int(res[o + 2]), int(res[o + 3]), int(res[o + 4])
            )
            for o in range(1, len(res), 5)
        ]
        return Verdict(bool(res[0]), outcomes)
