"""The response cache: lookup, store, TTL refresh, purge, and coalescing of identical misses.

Purge is O(1): each API has a version (`<prefix>v:<api>`) that is part of every entry key, and
purge writes a new one, so older entries become unreachable and expire on their own TTL. The
version is cached in-process for `version_cache_ms` (default 1 s): a purge is immediate in the
process that served it and visible to other replicas within that bound.

Coalescing: the first miss for a key registers a "fill in progress" marker. An identical miss in
the same process waits for that fill at most `coalesce_wait_ms` (default 100 ms, below Envoy's
default 200 ms message timeout), then looks up again and, still missing, goes upstream itself.
Waiting longer needs Envoy's `max_message_timeout` raised: the servicer asks Envoy for more time
(`override_message_timeout`) before it waits.

Writes (a miss's store, a hit's TTL refresh) go through `CacheWriter`
(rls/response_cache/writer.py):
the servicer submits them before its reply goes out, so Envoy closing the stream cannot lose
them; `close` drains them within `write_drain_ms`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rls.response_cache.config import CacheConfig, CacheRule
from rls.response_cache.entry import KIND_VARY, Entry, EntryError
from rls.response_cache.keys import Headers, entry_key, request_digest, vary_digest, version_key
from rls.response_cache.metrics import CacheMetrics
from rls.response_cache.store import GuardedStore, StoreDown, StoreError
from rls.response_cache.writer import REFRESH, STORE, CacheWriter, WriteJob

log = logging.getLogger("rls.cache")

INITIAL_VERSION = "0"


class Fill:
    """A miss whose response this process is fetching; identical misses may wait for it."""

    def __init__(self, cache: ResponseCache, key: str) -> None:
        self.cache = cache
        self.key = key
        self.done = asyncio.Event()
        self.released = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.done.set()
        if self.cache.fills.get(self.key) is self:
            del self.cache.fills[self.key]
        self.cache.metrics.fills.dec()


@dataclass(slots=True)
class RequestKey:
    """Everything needed to look up, and later store, one request's entry."""

    rule: CacheRule
    digest: bytes
    headers: Headers
    version: str = INITIAL_VERSION
    base_key: str = ""



@dataclass(frozen=True, slots=True)
class StoredResponse:
    """An upstream answer to store: its status, the headers kept, the body, and the request
    headers it varies on."""

    status: int
    headers: tuple[tuple[str, bytes], ...]
    body: bytes
    vary: frozenset[str]

@dataclass(slots=True)
class Lookup:
    """`entry` on a hit; on a miss, `fill` when this request should store the response."""

    entry: Entry | None = None
    keys: list[str] = field(default_factory=list)  # keys to refresh on a hit
    fill: Fill | None = None
    error: str | None = None  # bypass reason when the store failed


class ResponseCache:
    def __init__(
        self,
        config: CacheConfig,
        store: GuardedStore,
        metrics: CacheMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.fills: dict[str, Fill] = {}
        self.writer = CacheWriter(
            metrics, config.writer_workers, config.write_queue_size, config.write_queue_bytes
        )
        self._versions: dict[str, tuple[str, float]] = {}
        store.bind_metrics(metrics)

    # ------------------------------------------------------------------ keys and versions

    def request_key(
        self, rule: CacheRule, method: str, headers: Headers, body: bytes,
        members: Sequence[bytes | None] = (),
    ) -> RequestKey:
        return RequestKey(rule, request_digest(rule, method, headers, body, members), headers)

    async def version(self, api: str) -> str:
        cached = self._versions.get(api)
        now = time.monotonic()
        if cached is not None and now < cached[1]:
            return cached[0]
        raw = await self.store.get_version(version_key(self.config.key_prefix, api))
        version = raw.decode() if raw else INITIAL_VERSION
        self._versions[api] = (version, now + self.config.version_cache_ms / 1000)
        return version

    # ------------------------------------------------------------------ lookup

    async def lookup(
        self,
        rk: RequestKey,
        on_wait: Callable[[float], Awaitable[None]] | None = None,
        skip_read: bool = False,
    ) -> Lookup:
        """Hit, or miss (with a Fill ticket unless another fill is already running).

        Store errors never raise: the result carries the bypass reason instead.
        """
        try:
            started = time.perf_counter()
            rk.version = await self.version(rk.rule.api)
            rk.base_key = entry_key(self.config.key_prefix, rk.rule.api, rk.version, rk.digest)
            fill = self.fills.get(rk.base_key)
            if skip_read:  # request Cache-Control: no-cache: fetch fresh, store, never wait
                return Lookup(fill=self._start_fill(rk.base_key) if fill is None else None)
            found = await self._read(rk)
            self.metrics.lookup_seconds.observe(time.perf_counter() - started)
            if found is not None:
                return found
            fill = self.fills.get(rk.base_key)
            if fill is None or self.config.coalesce_wait_ms <= 0:
                return Lookup(fill=self._start_fill(rk.base_key) if fill is None else None)
            found = await self._wait_for_fill(rk, fill, on_wait)
            if found is not None:
                return found
            return Lookup(fill=None if rk.base_key in self.fills else self._start_fill(rk.base_key))
        except StoreDown:
            return Lookup(error="store_down")
        except StoreError as exc:
            self.metrics.errors.labels(exc.op).inc()
            log.warning("%s; request goes upstream uncached", exc)
            return Lookup(error="store_error")

    async def _read(self, rk: RequestKey) -> Lookup | None:
        raw = await self.store.get(rk.base_key)
        if raw is None:
            return None
        keys = [rk.base_key]
        try:
            entry = Entry.decode(raw)
            if entry.kind == KIND_VARY:
                key = entry_key(
                    self.config.key_prefix, rk.rule.api, rk.version,
                    vary_digest(rk.digest, entry.vary_names, rk.headers),
                )
                raw = await self.store.get(key)
                if raw is None:
                    return None
                keys.append(key)
                entry = Entry.decode(raw)
                if entry.kind == KIND_VARY:
                    raise EntryError("a Vary pointer points at another pointer")
        except EntryError as exc:
            self.metrics.errors.labels("decode").inc()
            log.warning("cache entry %s unreadable (%s); treated as a miss", keys[-1], exc)
            return None
        return Lookup(entry=entry, keys=keys)

    def _start_fill(self, key: str) -> Fill:
        fill = Fill(self, key)
        self.fills[key] = fill
        self.metrics.fills.inc()
        return fill

    async def _wait_for_fill(
        self, rk: RequestKey, fill: Fill, on_wait: Callable[[float], Awaitable[None]] | None
    ) -> Lookup | None:
        wait = self.config.coalesce_wait_ms / 1000
        if on_wait is not None:
            await on_wait(wait)
        try:
            await asyncio.wait_for(fill.done.wait(), wait)
        except TimeoutError:
            self.metrics.coalesced.labels("timeout").inc()
            return None
        found = await self._read(rk)
        self.metrics.coalesced.labels("hit" if found is not None else "miss").inc()
        return found

    # ------------------------------------------------------------------ after a hit

    def age(self, entry: Entry) -> int:
        return max(0, int(self.clock() - entry.stored_at_ms / 1000))

    def refresh_job(self, rule: CacheRule, keys: list[str]) -> WriteJob:
        """The TTL refresh of a hit, for the writer (submitted before the hit is answered)."""
        return WriteJob(REFRESH, rule.api, functools.partial(self.refresh, rule, keys))

    async def refresh(self, rule: CacheRule, keys: list[str]) -> bool:
        """Push the TTL of a hit entry (and its Vary pointer) back to the rule's full TTL."""
        for key in keys:
            try:
                await self.store.expire(key, rule.ttl)
            except StoreDown:
                return False
            except StoreError as exc:
                self.metrics.errors.labels(exc.op).inc()
                return False
        return True

    # ------------------------------------------------------------------ store

    def store_job(self, rk: RequestKey, reply: StoredResponse, fill: Fill | None) -> WriteJob:
        """The store of a cacheable miss, for the writer; the job owns `fill` from now on."""
        self.metrics.cacheable_misses.labels(rk.rule.api).inc()
        size = len(reply.body) + sum(len(n) + len(v) for n, v in reply.headers)
        return WriteJob(
            STORE,
            rk.rule.api,
            functools.partial(self.save, rk, reply, fill),
            size,
            None if fill is None else fill.release,
        )

    async def save(self, rk: RequestKey, reply: StoredResponse, fill: Fill | None) -> bool:
        """Write one response; True when written. Runs in the writer, after the reply."""
        rule = rk.rule
        vary = reply.vary
        try:
            now_ms = int(self.clock() * 1000)
            data = Entry(reply.status, reply.headers, reply.body, now_ms).encode()
            if vary:
                key = entry_key(
                    self.config.key_prefix, rule.api, rk.version,
                    vary_digest(rk.digest, vary, rk.headers),
                )
                await self.store.set(key, data, rule.ttl)
                pointer = Entry.vary_pointer(vary, now_ms).encode()
                await self.store.set(rk.base_key, pointer, rule.ttl)
            else:
                await self.store.set(rk.base_key, data, rule.ttl)
            self.metrics.stored_bytes.labels(rule.api).inc(len(data))
            return True
        except StoreDown:
            return False
        except StoreError as exc:
            self.metrics.errors.labels(exc.op).inc()
            log.warning("%s; response not cached", exc)
            return False
        finally:
            if fill is not None:
                fill.release()

    # ------------------------------------------------------------------ purge and stats

    async def purge(self, api: str) -> str:
        """New namespace version for `api`; raises StoreError when the store cannot be written."""
        if api not in self.config.apis:
            raise KeyError(api)
        version = format(time.time_ns() // 1000, "x")  # fresh; no read-modify-write race
        try:
            await self.store.set_version(version_key(self.config.key_prefix, api), version.encode())
        except StoreError as exc:
            self.metrics.errors.labels(exc.op).inc()
            raise
        self._versions[api] = (version, time.monotonic() + self.config.version_cache_ms / 1000)
        self.metrics.purges.labels(api).inc()
        log.info("cache purged for api %s (version %s)", api, version)
        return version

    def stats(self) -> dict[str, Any]:
        return {
            "store": self.store.name,
            "store_down": self.store.down,
            "fills_in_progress": len(self.fills),
            "writes_pending": self.writer.pending,
            "apis": sorted(self.config.apis),
            "rules": [
                {
                    "api": r.api,
                    "match": {"kind": r.match.kind, "name": r.match.name, "value": r.match.value},
                    "methods": sorted(r.methods),
                    "ttl": r.ttl,
                    "max_entry_bytes": r.max_entry_bytes,
                    "statuses": sorted(r.statuses),
                    "key_fields": list(r.key.fields),
                    "hits_from": r.hits_from,
                }
                for r in self.config.rules
            ],
            "counters": self.metrics.snapshot(),
        }

    # ------------------------------------------------------------------ shutdown

    async def close(self, timeout: float | None = None) -> None:
        """Drain pending writes (bounded by `write_drain_ms`), then close the store."""
        if timeout is None:
            timeout = self.config.write_drain_ms / 1000
        await self.writer.close(timeout)
        await self.store.close()
