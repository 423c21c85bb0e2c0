"""Where counters live: the embedded memory store or Redis (one script call per batch).

Both answer a batch with one Result per item, in order. A failure of the whole call (store
unreachable, timeout, breaker open) raises CounterStoreError; a failure of one item inside a
call (e.g. WRONGTYPE, OOM on that write) is that item's Result with code "unavailable".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, Protocol

from redis.exceptions import ResponseError

from rls.frequency.model import MAX_LISTING, Item, Result, original_key
from rls.stores.base import BackendError
from rls.stores.deadline import Deadline, LoopLag
from rls.stores.guard import Breaker
from rls.stores.memory import DEFAULT_MAX_BYTES, ENTRY_BYTES, LOW_WATER, least_recent
from rls.stores.redis import RedisBackend
from rls.stores.redis.cluster import Cluster

SCRIPT_FILE = "counters_window.lua"
log = logging.getLogger("rls.counters")


# The store could not answer the call at all: nothing is known to be charged. The stores' one
# error type (`StoreDown` while the breaker is open), under the name the service uses.
CounterStoreError = BackendError


class CounterStore(Protocol):
    name: str

    async def run(
        self, mode: str, items: Sequence[Item], now_ms: int | None = None
    ) -> list[Result]:
        """`mode` "a" charges each item's hits, "g" reads; all items in one atomic step."""
        ...


def script_text() -> str:
    return (resources.files("rls") / "lua" / SCRIPT_FILE).read_text(encoding="utf-8")


class MemoryCounterStore:
    """Counters in this process, on its own clock. Expired windows are dropped on access and
    by `sweep` (called from the service every few seconds).

    Bounded in bytes like the rate-limit memory store (rls.stores.memory, same estimate and
    order): `max_bytes` is a quarter of `--memory-max-bytes` by default; past it, expired
    counters go first, then the least recently used (Add or Get), down to LOW_WATER of it.
    An evicted counter starts again from 0 (`on_evict` counts them)."""

    name = "memory"

    def __init__(
        self,
        prefix: str = "rl:",
        clock: Callable[[], float] = time.time,
        max_bytes: int = DEFAULT_MAX_BYTES // 4,
        on_evict: Callable[[int], None] | None = None,
    ) -> None:
        self.prefix = prefix
        self._clock = clock
        # key -> [count, expires_ms, original key], in recency order (last used last)
        self._data: dict[str, list[Any]] = {}
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.evictions = 0
        self.on_evict = on_evict

    def __len__(self) -> int:
        return len(self._data)

    async def run(
        self, mode: str, items: Sequence[Item], now_ms: int | None = None
    ) -> list[Result]:
        now = int(self._clock() * 1000) if now_ms is None else now_ms
        results = [self._one(mode, item, now) for item in items]
        if self.nbytes > self.max_bytes:
            self._evict(now)
        return results

    def _evict(self, now: int) -> None:
        self.sweep(now)
        target = self.max_bytes * LOW_WATER
        if self.nbytes <= target:
            return
        data = self._data
        victims = least_recent(data, self.nbytes - target, _cost)
        for key in victims:
            self.nbytes -= _cost(key, data.pop(key))
        self.evictions += len(victims)
        if self.on_evict is not None:
            self.on_evict(len(victims))

    def _one(self, mode: str, item: Item, now: int) -> Result:
        base = item.base_key(self.prefix)
        if item.rolling:
            key, end = base + ":r", now + item.rolling_ms
        else:
            _, start, end, _ = item.bounds(now)
            key = f"{base}:{start}"
        data = self._data
        entry = data.pop(key, None)  # re-inserted below: now the most recent
        if entry is not None and entry[1] <= now:
            self.nbytes -= _cost(key, entry)
            entry = None
        if mode == "a":
            if entry is None:
                entry = [0, end, item.key if item.key_hash else ""]
                self.nbytes += _cost(key, entry)
            entry[0] += item.hits
        if entry is not None:
            data[key] = entry
        if entry is None:
            return Result(freq=0, ttl_ms=0 if item.rolling else end - now)
        return Result(freq=entry[0], ttl_ms=entry[1] - now)

    def listing(self, domain_prefix: str = "", limit: int = MAX_LISTING) -> dict[str, Any]:
        """Live counters under a domain, at most `limit` (`truncated` says more exist)."""
        now = int(self._clock() * 1000)
        head = self.prefix + "c{" + domain_prefix
        out: list[dict[str, Any]] = []
        for key, (count, exp, orig) in self._data.items():
            if exp <= now or not key.startswith(head):
                continue
            if len(out) >= limit:
                return {"counters": out, "truncated": True, "skipped": 0}
            original = orig or original_key(key.encode("utf-8", "surrogatepass"), self.prefix)
            out.append({"key": key, "original": original, "freq": count, "ttl_ms": exp - now})
        return {"counters": out, "truncated": False, "skipped": 0}

    def sweep(self, now_ms: int | None = None) -> int:
        now = int(self._clock() * 1000) if now_ms is None else now_ms
        dead = [k for k, v in self._data.items() if v[1] <= now]
        for k in dead:
            self.nbytes -= _cost(k, self._data.pop(k))
        return len(dead)


def _cost(key: str, entry: list[Any]) -> int:
    """Estimated bytes of one memory counter: as in the rate-limit store, plus the kept key."""
    return ENTRY_BYTES + len(key) + len(entry[2])


class RedisCounterStore:
    """Counters in Redis through `lua/counters_window.lua`: one EVALSHA per batch (one per
    hash slot in Cluster mode), reloaded on NOSCRIPT.

    It rides the RateLimit store (`backend`): its client (URL schemes, TLS), its breaker and
    error mapping, and its way to Redis (`RedisBackend.script_call`): the lean connection on
    standalone and Sentinel, where concurrent calls share one write as decisions do; redis-py
    within the pool's bound on Cluster, judged by the breakers of each call's masters.
    """

    name = "redis"

    def __init__(
        self,
        backend: RedisBackend,
        prefix: str = "rl:",
        timeout_s: float = 1.0,
        channel: str = "",
    ) -> None:
        self.backend = backend
        self.client = backend.client
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.channel = channel
        self.cluster = backend.cluster
        self._script = self.client.register_script(script_text())
        self._lag = LoopLag()  # not ticking: a counters call's deadline is on the wall clock

    def _deadline(self) -> Deadline:
        return Deadline(self._lag, self.timeout_s, self.timeout_s)

    async def run(
        self, mode: str, items: Sequence[Item], now_ms: int | None = None
    ) -> list[Result]:
        try:
            if self.cluster:
                return await self._run_cluster(mode, items, now_ms)
            return await self._run_group(mode, items, now_ms, None)
        except TimeoutError as exc:
            raise CounterStoreError(
                f"redis timeout after {self.timeout_s * 1000:.0f} ms (an Add may or may not "
                "have been applied)"
            ) from exc

    async def _run_cluster(
        self, mode: str, items: Sequence[Item], now_ms: int | None
    ) -> list[Result]:
        """One call per hash slot; a slot whose node fails marks only its items."""
        groups: dict[int, list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault(self.client.keyslot(item.base_key(self.prefix)), []).append(i)
        parts = list(groups.values())
        nodes = self.backend.topology
        assert isinstance(nodes, Cluster)
        answers = await asyncio.gather(
            *(
                self._run_group(mode, [items[i] for i in idx], now_ms, nodes.owners(slot))
                for slot, idx in zip(groups, parts, strict=True)
            ),
            return_exceptions=True,
        )
        results: list[Result] = [Result()] * len(items)
        failures = 0
        for idx, answer in zip(parts, answers, strict=True):
            if isinstance(answer, BaseException):
                failures += 1
                for i in idx:
                    results[i] = Result("unavailable", f"redis: {answer!r}")
                continue
            for i, res in zip(idx, answer, strict=True):
                results[i] = res
        if failures == len(parts):
            first = answers[0]
            if isinstance(first, (BackendError, TimeoutError)):
                raise first
            raise CounterStoreError(f"redis: {first!r}")
        return results

    async def _run_group(
        self, mode: str, items: Sequence[Item], now_ms: int | None, breaker: Breaker | None
    ) -> list[Result]:
        # Bounds are computed from our clock; the script picks by the store's. Items whose
        # store time fell outside (our clock off by more than a window) are sent once more
        # with bounds computed from the store's time that the first call returned.
        clock = int(time.time() * 1000) if now_ms is None else now_ms
        now, results = await self._call(mode, items, clock, now_ms, breaker)
        retry = [i for i, r in enumerate(results) if r is None]
        if retry:
            _, again = await self._call(mode, [items[i] for i in retry], now, now_ms, breaker)
            for i, res in zip(retry, again, strict=True):
                results[i] = res
        return [
            res if res is not None
            else Result("unavailable", "store clock moved outside the window bounds")
            for res in results
        ]

    async def _call(
        self, mode: str, items: Sequence[Item], bounds_ms: int, now_ms: int | None,
        breaker: Breaker | None,
    ) -> tuple[int, list[Result | None]]:
        keys = []
        sets: dict[tuple[int, ...], int] = {}
        specs = []
        originals = []
        prefix = self.prefix
        for item in items:
            keys.append(item.base_key(prefix))
            hashed = "1" if item.key_hash else "0"
            if hashed == "1":
                originals.append(item.key)
            if item.rolling:
                specs.append(f"r,{item.hits},{item.rolling_ms},{hashed}")
                continue
            edges = tuple(item.bounds(bounds_ms))
            index = sets.get(edges)
            if index is None:
                index = sets[edges] = len(sets)
            specs.append(f"c,{item.hits},{index},{hashed}")
        args: list[Any] = [
            mode,
            "" if now_ms is None else str(now_ms),
            self.channel,
            ";".join(",".join(map(str, edges)) for edges in sets),
            ";".join(specs),
            *originals,
        ]
        reply = await self.backend.script_call(
            self._script, keys, args, self._deadline(), breaker
        )
        now = int(reply[0])
        out: list[Result | None] = []
        for o in range(1, len(reply), 4):
            code = int(reply[o])
            if code == 1:
                out.append(None)
            elif code == 2:
                msg = reply[o + 3]
                out.append(Result("unavailable", msg.decode() if isinstance(msg, bytes) else msg))
            else:
                out.append(Result(freq=int(reply[o + 1]), ttl_ms=int(reply[o + 2])))
        return now, out

    async def listing(self, domain_prefix: str = "", limit: int = MAX_LISTING) -> dict[str, Any]:
        """Live counters under a domain (SCAN; Cluster: the first node only), at most `limit`,
        with their original keys. A key of the domain that is not a counter hash (WRONGTYPE,
        written by something else) is skipped and counted in `skipped`, never failing the
        listing; a connection failure raises (the caller answers 503)."""
        pattern = f"{self.prefix}c{{{domain_prefix}*"
        out: list[dict[str, Any]] = []
        skipped: list[tuple[bytes, str]] = []
        truncated = False
        client = self.client
        async for raw in client.scan_iter(match=pattern, count=500):
            key = raw if isinstance(raw, bytes) else raw.encode()
            if len(out) >= limit:
                truncated = True
                break
            try:
                count, orig = await client.hmget(key, "c", "k")
                ttl = await client.pttl(key)
                freq = int(count or 0)
            except (ResponseError, ValueError) as exc:
                skipped.append((key, str(exc)))
                continue
            if ttl == -2:  # expired between SCAN and HMGET
                continue
            original = orig.decode("utf-8", "backslashreplace") if orig else None
            out.append(
                {
                    "key": key.decode("utf-8", "backslashreplace"),
                    "original": original or original_key(key, self.prefix),
                    "freq": freq,
                    "ttl_ms": int(ttl),
                }
            )
        if skipped:
            log.warning(
                "counters listing of %s: skipped %d keys that are not counters, e.g. %r: %s",
                pattern, len(skipped), *skipped[0],
            )
        return {"counters": out, "truncated": truncated, "skipped": len(skipped)}
