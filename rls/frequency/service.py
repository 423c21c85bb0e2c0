"""The counters operations and their failure rules, shared by gRPC and admin HTTP.

- Add: charged in the store or an error. A store failure of the whole call raises
  CounterStoreError (gRPC UNAVAILABLE, HTTP 503); a failure of some items of a batch is
  reported on those items (code "unavailable": not charged).
- Get: from the store; a hot counter from the ≤ 1 s local cache; on a store failure from the
  last known value, marked stale (no error unless nothing is known of that counter).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from rls.frequency.local_answers import HotKeys, StaleCache, follow_invalidations
from rls.frequency.model import MAX_BATCH, CountersConfig, InvalidItem, Item, Result
from rls.frequency.storage import (
    CounterStore,
    CounterStoreError,
    MemoryCounterStore,
    RedisCounterStore,
)
from rls.stores.redis import RedisBackend

# (op, code) of the items the store did not answer as asked: their series exist from the start.
FAILURE_ITEMS = (("add", "unavailable"), ("get", "unavailable"), ("get", "stale"))


class CountersMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        r = registry
        self.items = Counter(
            "rls_counters_items", "Counter items by operation and outcome", ["op", "code"],
            registry=r,
        )
        self.stale = Counter(
            "rls_counters_stale_answers", "Gets answered from the last known value", registry=r
        )
        self.hot_answers = Counter(
            "rls_counters_hot_answers", "Gets answered from the hot-key cache", registry=r
        )
        self.hot_keys = Gauge("rls_counters_hot_keys", "Counters cached as hot now", registry=r,
                              multiprocess_mode="livesum")
        self.invalidations = Counter(
            "rls_counters_invalidations", "Hot-key invalidations received (pub/sub)", registry=r
        )
        for op, code in FAILURE_ITEMS:  # at 0 from the start: rate() counts the first burst
            self.items.labels(op, code)
        self.memory_evictions = Counter(
            "rls_counters_memory_evictions",
            "Live counters the memory store forgot at its byte bound (least recently used)",
            registry=r,
        )


class CountersService:
    def __init__(
        self,
        store: CounterStore,
        config: CountersConfig | None = None,
        registry: CollectorRegistry | None = None,
        prefix: str = "rl:",
        subscriber: Any = None,
    ) -> None:
        self.store = store
        self.config = config or CountersConfig()
        self.prefix = prefix
        self.metrics = CountersMetrics(registry)
        cfg = self.config
        self.stale = StaleCache(cfg.stale_max_entries, cfg.stale_max_bytes)
        self.hot = HotKeys(cfg.hot_top_n, cfg.hot_threshold, cfg.hot_ttl_ms)
        self._subscriber = subscriber  # a redis-py client for pub/sub, None: no invalidation
        self._tasks: list[asyncio.Task[None]] = []
        if isinstance(store, MemoryCounterStore):
            store.on_evict = self.metrics.memory_evictions.inc

    @classmethod
    def for_backend(
        cls,
        backend: Any,
        config: CountersConfig,
        registry: CollectorRegistry | None,
        prefix: str,
    ) -> CountersService:
        """The counters service on the RateLimit backend's store (Redis client, breaker)."""
        if not isinstance(backend, RedisBackend):  # a quarter of the memory store's budget
            budget = getattr(backend, "max_bytes", None)
            memory = MemoryCounterStore(prefix) if budget is None else MemoryCounterStore(
                prefix, max_bytes=budget // 4
            )
            return cls(memory, config, registry, prefix)
        channel = f"{prefix}counters:changed:" if config.hot_top_n > 0 else ""
        store = RedisCounterStore(
            backend, prefix, timeout_s=config.timeout_ms / 1000, channel=channel
        )
        subscriber = backend.client if channel else None
        return cls(store, config, registry, prefix, subscriber=subscriber)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._subscriber is not None and isinstance(self.store, RedisCounterStore):
            self._tasks.append(
                loop.create_task(
                    follow_invalidations(
                        self._subscriber, self.store.channel, self.hot,
                        self.metrics.invalidations.inc,
                    )
                )
            )
        if isinstance(self.store, MemoryCounterStore):
            self._tasks.append(loop.create_task(self._sweep_forever(self.store)))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    async def _sweep_forever(self, store: MemoryCounterStore) -> None:
        while True:
            await asyncio.sleep(5.0)
            store.sweep()

    def _ident(self, item: Item) -> str:
        return item.base_key(self.prefix)

    async def add(self, items: Sequence[Item], now_ms: int | None = None) -> list[Result]:
        """Charge every item in one store call. Raises CounterStoreError when nothing could
        be charged; items the store refused come back with code "unavailable"."""
        if not 1 <= len(items) <= MAX_BATCH:
            raise InvalidItem(f"a batch holds 1..{MAX_BATCH} items")
        try:
            results = await self.store.run("a", items, now_ms)
        except CounterStoreError:
            self.metrics.items.labels("add", "unavailable").inc(len(items))
            raise
        clock = int(time.time() * 1000)
        failed = 0
        remember, hot = self.stale.remember, self.hot
        for item, res in zip(items, results, strict=True):
            ident = self._ident(item)
            if res.code == "ok":
                remember(ident, res, clock)
                hot.store(ident, res)
            else:
                failed += 1
                hot.invalidate(ident)
        self._count("add", len(items) - failed, failed)
        return results

    def _count(self, op: str, ok: int, failed: int) -> None:
        if ok:
            self.metrics.items.labels(op, "ok").inc(ok)
        if failed:
            self.metrics.items.labels(op, "unavailable").inc(failed)

    async def get(self, items: Sequence[Item], now_ms: int | None = None) -> list[Result]:
        """Read every item: hot ones from memory, the rest in one store call; on a store
        failure, what is known locally (stale) and "unavailable" for the rest."""
        if not 1 <= len(items) <= MAX_BATCH:
            raise InvalidItem(f"a batch holds 1..{MAX_BATCH} items")
        results: list[Result | None] = [None] * len(items)
        idents = [self._ident(item) for item in items]
        todo: list[int] = []
        hot = self.hot
        use_hot = hot.enabled and now_ms is None
        for i, ident in enumerate(idents):
            cached = hot.lookup(ident) if use_hot else None
            if cached is not None:
                results[i] = cached
            else:
                todo.append(i)
        if len(todo) < len(items):
            self.metrics.hot_answers.inc(len(items) - len(todo))
            self._count("get", len(items) - len(todo), 0)
        self.metrics.hot_keys.set(len(hot.hot))
        if todo:
            clock = int(time.time() * 1000)
            try:
                fresh = await self.store.run("g", [items[i] for i in todo], now_ms)
            except CounterStoreError as exc:
                for i in todo:
                    results[i] = self._stale_or_error(idents[i], clock, str(exc))
            else:
                ok = 0
                for i, res in zip(todo, fresh, strict=True):
                    if res.code == "ok":
                        ok += 1
                        self.stale.remember(idents[i], res, clock)
                        hot.store(idents[i], res)
                    else:
                        res = self._stale_or_error(idents[i], clock, res.message)
                    results[i] = res
                self._count("get", ok, 0)
        return results  # type: ignore[return-value]

    def _stale_or_error(self, ident: str, now_ms: int, why: str) -> Result:
        known = self.stale.answer(ident, now_ms)
        if known is not None:
            self.metrics.stale.inc()
            self.metrics.items.labels("get", "stale").inc()
            known.message = f"store unavailable, last known value: {why}"
            return known
        self.metrics.items.labels("get", "unavailable").inc()
        return Result("unavailable", f"store unavailable and no known value: {why}")

    async def listing(self, domain: str) -> dict[str, Any]:
        """Live counters of a domain with their original keys, at most MAX_LISTING:
        {"counters": [...], "truncated": more exist, "skipped": keys that are not counters}."""
        prefix = f"{len(domain.encode())}:{domain}:"
        store = self.store
        if isinstance(store, RedisCounterStore):
            escaped = "".join("\\" + ch if ch in "*?[]\\" else ch for ch in prefix)
            try:
                return await store.listing(escaped)
            except Exception as exc:
                raise CounterStoreError(f"redis: {exc}") from exc
        if isinstance(store, MemoryCounterStore):
            return store.listing(prefix)
        return {"counters": [], "truncated": False, "skipped": 0}
