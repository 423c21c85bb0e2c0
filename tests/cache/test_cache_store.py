"""Store backends on a real redis-server: Redis mode, and SSDB mode sending only SSDB-safe
commands (checked with INFO commandstats on a Redis of its own, handshake included)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from conftest import RedisServer, free_port, start_redis

from rls.cache.cache import ResponseCache
from rls.cache.keys import Headers
from rls.cache.metrics import CacheMetrics
from rls.cache.store import (
    GuardedStore,
    MemoryCacheStore,
    RedisCacheStore,
    StoreDown,
    StoreError,
    create_store,
)

from .helpers import config

SSDB_SAFE = {"get", "setex", "expire"}


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()


def commands(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): v["calls"] for name, v in stats.items()}


async def exercise(store: GuardedStore) -> None:
    """Every cache operation: miss, store, hit, refresh, Vary pointer, purge, long key."""
    cache = ResponseCache(config(), store, CacheMetrics())
    translate, items = cache.config.rules
    headers = Headers([(":path", b"/translate"), ("x-cache-key", b"k")])
    rk = cache.request_key(translate, "POST", headers, b"body")
    assert (await cache.lookup(rk)).fill is not None
    await cache.save(rk, 200, (("content-type", b"text/plain"),), b"hello", frozenset(), None)
    hit = await cache.lookup(rk)
    assert hit.entry is not None and hit.entry.body == b"hello"
    await cache.refresh(translate, hit.keys)

    vary_headers = Headers([(":path", b"/items?p=1"), ("accept-language", b"en")])
    vk = cache.request_key(items, "GET", vary_headers, b"")
    await cache.lookup(vk)
    await cache.save(vk, 200, (), b"en", frozenset({"accept-language"}), None)
    vary_hit = await cache.lookup(vk)
    assert vary_hit.entry is not None and vary_hit.entry.body == b"en"
    await cache.refresh(items, vary_hit.keys)

    await cache.purge("translate")
    assert (await cache.lookup(rk)).entry is None
    await store.set("p:" + "k" * 400, b"v", 5)  # bounded to <= 255 bytes
    assert await store.get("p:" + "k" * 400) == b"v"
    await store.close()


async def test_ssdb_mode_sends_only_ssdb_safe_commands(own_redis: RedisServer) -> None:
    client = own_redis.client()
    client.flushall()
    client.config_resetstat()
    await exercise(create_store(f"ssdb://127.0.0.1:{own_redis.port}", timeout_ms=2000))
    sent = commands(client)
    sent.pop("config|resetstat", None)  # this test's own calls
    sent.pop("info", None)
    assert set(sent) <= SSDB_SAFE, sent  # no HELLO, CLIENT SETINFO, SELECT, SET PX, PEXPIRE
    assert {"get", "setex", "expire"} <= set(sent)
    # the version key is written with SETEX (a plain SET would keep an old TTL on SSDB)
    [version_key] = client.keys("rc:v:*")
    assert client.ttl(version_key) > 9 * 365 * 86400
    assert all(len(k) <= 255 for k in client.keys("*"))


async def test_redis_mode_uses_millisecond_commands(own_redis: RedisServer) -> None:
    client = own_redis.client()
    client.flushall()
    client.config_resetstat()
    await exercise(create_store(f"redis://127.0.0.1:{own_redis.port}/0", timeout_ms=2000))
    sent = commands(client)
    assert {"get", "set", "pexpire"} <= set(sent)
    assert "setex" not in sent and "eval" not in sent and "evalsha" not in sent
    [version_key] = client.keys("rc:v:*")
    assert client.ttl(version_key) == -1  # Redis: the version never expires
    ttls = [client.pttl(k) for k in client.keys("rc:e:translate:*")]
    assert ttls and all(0 < t <= 7 * 86400 * 1000 for t in ttls)


async def test_redis_store_basics(redis_url: str) -> None:
    store = RedisCacheStore(redis_url, timeout_ms=2000)
    await store.set("k", b"\x00\xffvalue", 30)
    assert await store.get("k") == b"\x00\xffvalue"
    await store.expire("k", 100)
    assert 99_000 < redis.Redis.from_url(redis_url).pttl("k") <= 100_000
    assert await store.get("missing") is None
    await store.close()


async def test_unreachable_store_errors_then_is_marked_down() -> None:
    store = create_store(f"redis://127.0.0.1:{free_port()}/0", timeout_ms=50)
    for _ in range(3):
        with pytest.raises(StoreError) as info:
            await store.get("k")
        assert not isinstance(info.value, StoreDown)
        assert info.value.op == "get"
    assert store.down
    with pytest.raises(StoreDown):
        await store.set("k", b"v", 1)
    await store.close()


def test_store_urls() -> None:
    assert isinstance(create_store(None), MemoryCacheStore)
    assert isinstance(create_store("memory://"), MemoryCacheStore)
    ssdb = create_store("ssdb://:secret@db.local:8889")
    assert isinstance(ssdb, RedisCacheStore) and ssdb.ssdb and ssdb.name == "ssdb"
    kwargs = ssdb.client.connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("db.local", 8889, 0)
    assert kwargs["protocol"] == 2 and kwargs["driver_info"] is None
    assert kwargs["password"] == "secret"
    assert create_store("redis://localhost:6379/2").name == "redis"
    with pytest.raises(ValueError, match="only database 0"):
        create_store("ssdb://localhost:8888/1")
    with pytest.raises(ValueError, match="unsupported cache store URL"):
        create_store("memcached://localhost")
