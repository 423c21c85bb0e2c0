"""Cache stores: Redis, SSDB (a strict Redis-protocol subset) and in-process memory.

Every operation has a short deadline (default 50 ms, `store_timeout_ms`) and runs the stores'
one way (`rls.stores.guard.StoreGuard`): a failure or a timeout raises `StoreError`; the cache
then lets the request go upstream uncached. The store's `CircuitBreaker` (the counter stores'
own) opens on evidence (`FAILURES_TO_TRIP` connection errors in a row, or a failed probe after
a timeout or an odd answer): the store is then marked down and fails fast (`StoreDown`) instead
of making every request wait for a dead server's timeout, until a probe (a PING within the same
deadline) finds it answering again.

URL schemes: `redis://`, `rediss://`, `unix://` (redis-py, RESP3 as it likes; GET, SET PX,
PEXPIRE), `ssdb://[:password@]host:port` (same client restricted to GET, SETEX, EXPIRE over
RESP2, no HELLO, no CLIENT SETINFO, no SELECT: SSDB 1.9.8 refuses those, and takes `SET … PX`
but ignores its expiry), `memory://` (one process, an LRU bounded in bytes; for tests, demos and
single-process use).
"""

from __future__ import annotations

import hashlib
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Awaitable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from rls.response_cache.metrics import CacheMetrics
from rls.stores.base import BackendError, StoreDown
from rls.stores.breaker import CircuitBreaker
from rls.stores.deadline import Deadline, LoopLag
from rls.stores.guard import Breaker, StoreGuard, within
from rls.stores.redis.connect import connect
from rls.stores.redis.errors import judge

__all__ = [
    "GuardedStore", "MemoryCacheStore", "RedisCacheStore", "StoreDown", "StoreError",
    "bound_key", "create_store",
]

T = TypeVar("T")

MAX_KEY_BYTES = 255  # SSDB's limit (longer keys error on write and look like misses on read)
VERSION_TTL = 10 * 365 * 86400  # SSDB mode only: every SSDB write carries a TTL (SETEX)
FAILURES_TO_TRIP = 3
PROBE_INTERVAL_S = 0.1
PROBE_KEY = "rls:cache:probe"  # while marked down, the store is pinged this often
# Retried once on a fresh connection (redis-py's stubs say RedisError only; Retry catches any).
RETRIED_ERRORS: Any = (RedisConnectionError, RuntimeError)


# A store operation failed or timed out (`op` names it for the errors metric); `StoreDown`: the
# store is marked down (its breaker is open) and the operation was not attempted. The stores'
# one error type, under the names the cache uses.
StoreError = BackendError


def bound_key(key: str) -> str:
    """Keys over 255 bytes become a readable head plus a SHA-256 of the whole (SSDB-safe)."""
    raw = key.encode()
    if len(raw) <= MAX_KEY_BYTES:
        return key
    head = raw[:150].decode(errors="ignore")
    return f"{head}#{hashlib.sha256(raw).hexdigest()}"


def _timed_out(exc: Exception, breaker: Breaker) -> str | None:
    """The redis errors' meaning, and a timeout named (TimeoutError's text is empty)."""
    why = judge(exc, breaker)
    return why if why is None or why else type(exc).__name__


class GuardedStore(ABC):
    """Deadline and breaker shared by every backend (the stores' `StoreGuard`)."""

    name = "store"

    def __init__(self, timeout_ms: int = 50) -> None:
        self.timeout = timeout_ms / 1000
        self._lag = LoopLag()  # not ticking: a cache operation's deadline is on the wall clock
        self.breaker = CircuitBreaker("cache store", FAILURES_TO_TRIP,
                                      self._probe, probe_interval=PROBE_INTERVAL_S)
        self._guard = StoreGuard(self.breaker, _timed_out, "cache store")

    @property
    def down(self) -> bool:
        return not self.breaker.allow()

    def _deadline(self) -> Deadline:
        return Deadline(self._lag, self.timeout, self.timeout)

    async def _run(self, op: str, call: Awaitable[T]) -> T:
        try:
            return await self._guard.run(call, self._deadline(), op=op)
        except TimeoutError as exc:
            raise StoreError(f"cache store {op}: timed out after {self.timeout * 1000:.0f} ms",
                             op) from exc

    async def _probe(self) -> bool:
        """Whether the store answers within one operation's deadline."""
        try:
            await within(self._deadline(), self._ping())
        except (TimeoutError, RedisError, OSError):
            return False
        return True

    async def _ping(self) -> None:
        """A read of the store itself (a Redis store PINGs)."""
        await self._get(PROBE_KEY)

    async def get(self, key: str) -> bytes | None:
        return await self._run("get", self._get(bound_key(key)))

    async def set(self, key: str, value: bytes, ttl: int) -> None:
        await self._run("set", self._set(bound_key(key), value, ttl))

    async def expire(self, key: str, ttl: int) -> None:
        await self._run("expire", self._expire(bound_key(key), ttl))

    async def get_version(self, key: str) -> bytes | None:
        return await self._run("version", self._get(bound_key(key)))

    async def set_version(self, key: str, value: bytes) -> None:
        await self._run("purge", self._set_version(bound_key(key), value))

    async def close(self) -> None:
        await self.breaker.stop()

    def bind_metrics(self, metrics: CacheMetrics) -> None:
        """Hook for stores with metrics of their own (the memory store's size)."""
        return None

    # backend primitives, one set per store kind
    @abstractmethod
    async def _get(self, key: str) -> bytes | None: ...

    @abstractmethod
    async def _set(self, key: str, value: bytes, ttl: int) -> None: ...

    @abstractmethod
    async def _expire(self, key: str, ttl: int) -> None: ...

    @abstractmethod
    async def _set_version(self, key: str, value: bytes) -> None: ...


class RedisCacheStore(GuardedStore):
    """redis-py asyncio client; `ssdb=True` restricts it to SSDB's safe subset.

    Redis mode: GET, SET key value PX ttl, PEXPIRE, and a plain SET for the version (no TTL).
    SSDB mode: GET, SETEX, EXPIRE only: SSDB accepts `SET ... PX` but ignores the TTL, has no
    PEXPIRE, and a plain SET keeps a key's old TTL, so the version is written with SETEX and a
    ten-year TTL.
    """

    def __init__(
        self,
        url: str,
        *,
        ssdb: bool = False,
        timeout_ms: int = 50,
        connect_timeout_ms: int | None = None,
        pool_size: int = 64,
    ) -> None:
        super().__init__(timeout_ms)
        self.ssdb = ssdb
        self.name = "ssdb" if ssdb else "redis"
        self.url = url
        seconds = timeout_ms / 1000
        common: dict[str, Any] = {
            "socket_timeout": seconds,
            "socket_connect_timeout": (connect_timeout_ms or timeout_ms) / 1000,
            "max_connections": pool_size,
            # A burst larger than the pool waits for a free connection (within the same
            # deadline) instead of failing with "Too many connections", which would count
            # as store failures and could mark a healthy store down.
            "timeout": seconds,
            # One retry, on a connection error only: after a store restart every pooled
            # connection is dead, and without it each would fail one request (and three in a
            # row mark the store down). Timeouts are never retried: the deadline is ours.
            # RuntimeError: on uvloop a pooled connection to a killed SSDB fails its next
            # write with "the handler is closed" instead of a ConnectionError.
            "retry": Retry(NoBackoff(), 1, supported_errors=RETRIED_ERRORS),
        }
        if ssdb:
            parts = urlsplit(url)
            db = parts.path.strip("/")
            if db not in ("", "0"):
                raise ValueError(f"{url}: SSDB has only database 0 (no SELECT)")
            pool = aioredis.BlockingConnectionPool(
                host=parts.hostname or "127.0.0.1",
                port=parts.port or 8888,
                db=0,
                password=parts.password or None,
                protocol=2,  # SSDB rejects HELLO, which RESP3 needs
                driver_info=None,  # no CLIENT SETINFO
                **common,
            )
            self.client: Any = aioredis.Redis.from_pool(pool)  # aclose() closes the pool too
        else:
            # rls's one Redis connector: standalone, TLS, Sentinel and Cluster URLs alike.
            self.client = connect(
                url,
                seconds,
                common["socket_connect_timeout"],
                pool_size,
                pool_timeout_s=seconds,
                retry=common["retry"],
            )

    async def _get(self, key: str) -> bytes | None:
        value = await self.client.get(key)
        return None if value is None else bytes(value)

    async def _set(self, key: str, value: bytes, ttl: int) -> None:
        if self.ssdb:
            # execute_command: redis-py deprecates its setex() helper, and SSDB needs SETEX.
            await self.client.execute_command("SETEX", key, max(1, ttl), value)
        else:
            await self.client.set(key, value, px=ttl * 1000)

    async def _expire(self, key: str, ttl: int) -> None:
        if self.ssdb:
            await self.client.expire(key, max(1, ttl))
        else:
            await self.client.pexpire(key, ttl * 1000)

    async def _set_version(self, key: str, value: bytes) -> None:
        if self.ssdb:
            await self.client.execute_command("SETEX", key, VERSION_TTL, value)
        else:
            await self.client.set(key, value)

    async def _ping(self) -> None:
        await self.client.ping()

    async def close(self) -> None:
        await super().close()
        await self.client.aclose()


ENTRY_OVERHEAD = 100  # bytes per entry on top of key and value: dict slot, tuple, objects


class MemoryCacheStore(GuardedStore):
    """An LRU with expiry, bounded in bytes; one process (tests, demos, a single replica).

    Each entry costs `len(key) + len(value) + ENTRY_OVERHEAD` bytes of `max_bytes`; a write
    that would exceed the budget evicts least recently used entries first (expired ones go
    when reached, or when they are the oldest). A value larger than the whole budget is not
    kept. Version keys live apart and are never evicted: evicting one would revive a purged
    namespace.
    """

    name = "memory"

    def __init__(self, timeout_ms: int = 50, max_bytes: int = 64 << 20) -> None:
        super().__init__(timeout_ms)
        self.max_bytes = max_bytes
        self.data: OrderedDict[str, tuple[bytes, float | None]] = OrderedDict()
        self.versions: dict[str, bytes] = {}
        self.size = 0
        self._metrics: CacheMetrics | None = None

    def bind_metrics(self, metrics: CacheMetrics) -> None:
        self._metrics = metrics
        self._resized()

    def _resized(self) -> None:
        # Set on every change rather than set_function: with --workers, prometheus_client's
        # multiprocess mode reads gauges from files, where a callback never lands.
        if self._metrics is not None:
            self._metrics.memory_bytes.set(self.size)

    @staticmethod
    def _cost(key: str, value: bytes) -> int:
        return len(key.encode()) + len(value) + ENTRY_OVERHEAD

    def _remove(self, key: str) -> None:
        value, _ = self.data.pop(key)
        self.size -= self._cost(key, value)
        self._resized()

    def _live(self, key: str) -> bytes | None:
        item = self.data.get(key)
        if item is None:
            return None
        value, deadline = item
        if deadline is not None and time.monotonic() >= deadline:
            self._remove(key)
            return None
        self.data.move_to_end(key)  # most recently used
        return value

    async def _get(self, key: str) -> bytes | None:
        if key in self.versions:
            return self.versions[key]
        return self._live(key)

    async def _set(self, key: str, value: bytes, ttl: int) -> None:
        if key in self.data:
            self._remove(key)
        cost = self._cost(key, value)
        if cost > self.max_bytes:
            self._evicted()
            return
        while self.data and self.size + cost > self.max_bytes:
            self._remove(next(iter(self.data)))  # least recently used
            self._evicted()
        self.data[key] = (value, time.monotonic() + ttl)
        self.size += cost
        self._resized()

    def _evicted(self) -> None:
        if self._metrics is not None:
            self._metrics.memory_evictions.inc()

    async def _expire(self, key: str, ttl: int) -> None:
        value = self._live(key)
        if value is not None:
            self.data[key] = (value, time.monotonic() + ttl)

    async def _set_version(self, key: str, value: bytes) -> None:
        self.versions[key] = value

    def ttl(self, key: str) -> float | None:
        item = self.data.get(bound_key(key))
        if item is None or item[1] is None:
            return None
        return item[1] - time.monotonic()


def create_store(
    url: str | None, timeout_ms: int = 50, memory_max_bytes: int = 64 << 20
) -> GuardedStore:
    """A store for `url` (`redis://`, `rediss://`, `unix://`, `ssdb://`, `memory://`)."""
    if not url or url == "memory://":
        return MemoryCacheStore(timeout_ms, memory_max_bytes)
    scheme = urlsplit(url).scheme
    if scheme == "ssdb":
        return RedisCacheStore(url, ssdb=True, timeout_ms=timeout_ms)
    if scheme in REDIS_SCHEMES:
        return RedisCacheStore(url, timeout_ms=timeout_ms)
    raise ValueError(
        f"unsupported cache store URL {url!r} (redis://, rediss://, redis+sentinel://, "
        "redis+cluster://, unix://, ssdb://, memory://)"
    )


REDIS_SCHEMES = (
    "redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel", "redis+cluster",
    "rediss+cluster",
)
