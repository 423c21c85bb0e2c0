"""Helpers shared by the algorithm tests: constants and the wall-clock guard for Redis.

Tests inject `now_ms`, but Redis expires keys on its own clock: the scripts set each TTL
relative to the injected now, and rls keeps every state at least GRACE_MS (1 s) past the
last moment it matters. So a Redis replay is faithful as long as real time never runs ahead
of the injected clock by a second or more between two calls; on a heavily loaded machine a
stall can break that and Redis then forgets state the injected clock still needs (a false
difference). `Guarded` detects such a stall and raises `WallClockStall`; callers re-run the
example on fresh keys.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ParamSpec, TypeVar

from rls.core.algorithms.registry import ALGORITHM_NAMES, BURST_ALGORITHMS
from rls.core.model import Check, Verdict
from rls.stores.redis import RedisBackend

ALGORITHMS = ALGORITHM_NAMES  # from the registry: a new algorithm is replayed too
BUCKETS = BURST_ALGORITHMS
BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: a whole UTC day, realistic magnitudes
STALL_MS = 800  # below rls's GRACE_MS of 1000, with room for the call itself
ATTEMPTS = 3


class WallClockStall(Exception):
    """Real time ran ahead of the injected clock: Redis TTLs may have run out early."""


class Guarded:
    """A RedisBackend whose decisions check that real time has not outrun injected time."""

    def __init__(self, redis: RedisBackend) -> None:
        self.redis = redis
        self.name = redis.name
        self._lead: float | None = None  # least (real - injected) seen so far

    def reset(self) -> None:
        self._lead = None

    def _check(self, now_ms: int | None) -> None:
        if now_ms is None:
            return
        lead = time.monotonic() * 1000 - now_ms
        if self._lead is None or lead < self._lead:
            self._lead = lead
        if lead - self._lead > STALL_MS:
            raise WallClockStall(f"real time ran {lead - self._lead:.0f} ms ahead")

    async def decide(
        self, checks: Sequence[Check], now_ms: int | None = None, *args: Any
    ) -> Verdict:
        self._check(now_ms)
        verdict = await self.redis.decide(checks, now_ms, *args)
        self._check(now_ms)
        return verdict

    def __getattr__(self, name: str) -> Any:
        return getattr(self.redis, name)


P = ParamSpec("P")
R = TypeVar("R")


def retry_on_stall(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Re-run an async test (it must build fresh keys on each run) after a wall-clock stall."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        for attempt in range(ATTEMPTS):
            for value in (*args, *kwargs.values()):
                if isinstance(value, Guarded):
                    value.reset()
            try:
                return await fn(*args, **kwargs)
            except WallClockStall:
                if attempt == ATTEMPTS - 1:
                    raise AssertionError(
                        f"the machine stalled for over a second in all {ATTEMPTS} attempts"
                    ) from None
        raise AssertionError("unreachable")

    return wrapper
