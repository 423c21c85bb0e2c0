"""Redis Cluster: one circuit breaker per master, so a dead master costs only its own slots.

With one breaker for the whole cluster, a dead master opened it for every call, and its probe
(a PING to the client's default node, a healthy master) closed it again at once: the breaker
flapped dozens of times per second while calls for the dead master's slots sat in redis-py's
retries until their deadline. Here a call is judged by the masters that own its slots:

- `group(names)` is the breaker of one call: open when any of its masters' breakers is open,
  and its failures, suspicions and health checks go to those masters only;
- each master's probe PINGs that master, in the probe thread on the probe's own connection;
- while any master's breaker is open, the slot map is read again (at most once per probe
  interval), so slots that a replica took over route to it at once: a master that no longer
  owns slots has its breaker dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rls.stores.breaker import CircuitBreaker

log = logging.getLogger("rls.backend")


class NodeGroup:
    """The breakers of one call's masters, used like one `CircuitBreaker`."""

    __slots__ = ("_breakers",)

    def __init__(self, breakers: list[CircuitBreaker]) -> None:
        self._breakers = breakers

    def allow(self) -> bool:
        return all(b.allow() for b in self._breakers)

    def success(self) -> None:
        for b in self._breakers:
            b.success()

    def failure(self, why: str = "") -> None:
        for b in self._breakers:
            b.failure(why)

    def suspect(self) -> None:
        for b in self._breakers:
            b.suspect()

    async def check(self) -> bool:
        """Whether every master of the call answers a probe now."""
        results = await asyncio.gather(*(b.check() for b in self._breakers))
        return all(results)


class NodeBreakers:
    """The masters' breakers of one cluster client, created on first use."""

    def __init__(
        self,
        client: Any,
        probe_client: Any,
        probe_thread: ThreadPoolExecutor,
        make_breaker: Callable[[str], CircuitBreaker],
        refresh_interval: float,
    ) -> None:
        self._client = client  # redis-py's asyncio RedisCluster: its slot map routes calls
        self._probe_client = probe_client  # the blocking RedisCluster of the probe thread
        self._probe_thread = probe_thread
        self._make_breaker = make_breaker
        self._refresh_interval = refresh_interval
        self._breakers: dict[str, CircuitBreaker] = {}
        self._refreshed_at = 0.0
        self._refreshing: asyncio.Task[None] | None = None

    def owner(self, slot: int) -> str | None:
        """The master serving `slot` in the client's current map (None: not known yet)."""
        try:
            node = self._client.nodes_manager.get_node_from_slot(slot)
        except Exception:  # no map yet, or the slot is not covered
            return None
        name: str = node.name
        return name

    def group(self, names: Iterable[str]) -> NodeGroup:
        return NodeGroup([self._breaker(name) for name in names])

    def any_open(self) -> bool:
        return any(not b.allow() for b in self._breakers.values())

    def _breaker(self, name: str) -> CircuitBreaker:
        breaker = self._breakers.get(name)
        if breaker is None:
            breaker = self._breakers[name] = self._make_breaker(name)
            breaker.set_probe(lambda: self._probe(name))
        return breaker

    async def _probe(self, name: str) -> bool:
        """PING `name` on the probe's connection; while it is down, read the slot map again
        (rate-limited): once a replica took its slots over, it owns nothing and is dropped."""
        loop = asyncio.get_running_loop()
        try:
            if await loop.run_in_executor(self._probe_thread, self._ping, name):
                return True
        except Exception as exc:  # any failure is a failed probe
            breaker = self._breakers.get(name)
            if breaker is not None:
                breaker.last_error = str(exc) or type(exc).__name__
        await self.refresh()
        if name not in self._primaries():
            log.warning("redis cluster node %s owns no slots any more: its breaker closes", name)
            self._breakers.pop(name, None)
            return True  # nothing routes to it: stop probing
        return False

    def _ping(self, name: str) -> bool:
        host, _, port = name.rpartition(":")
        node = self._probe_client.get_node(host=host, port=int(port))
        if node is None:
            node = self._probe_client.get_node(node_name=name)
        if node is None:
            return False
        connection = node.redis_connection or self._probe_client.get_redis_connection(node)
        return bool(connection.ping())

    def _primaries(self) -> set[str]:
        slots = self._client.nodes_manager.slots_cache
        return {nodes[0].name for nodes in slots.values() if nodes}

    async def refresh(self) -> None:
        """Read the cluster's slot map again (one at a time, at most once per interval)."""
        loop = asyncio.get_running_loop()
        if self._refreshing is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._refreshing)
            return
        if loop.time() - self._refreshed_at < self._refresh_interval:
            return
        self._refreshed_at = loop.time()
        self._refreshing = loop.create_task(self._client.nodes_manager.initialize())
        try:
            await asyncio.shield(self._refreshing)
        except Exception as exc:  # a map not read now is read next time
            log.debug("redis cluster slot map not refreshed: %s", exc)
        finally:
            self._refreshing = None

    async def stop(self) -> None:
        for breaker in list(self._breakers.values()):
            await breaker.stop()
