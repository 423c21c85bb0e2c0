"""Store backends on real servers: Redis mode on redis-server, SSDB mode on a real SSDB 1.9.8
sending only SSDB-safe commands (as SSDB's own request log shows, handshake included), and the
memory store's LRU."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
import redis
import uvloop
from conftest import RedisServer, free_port, start_redis, wait_until
from prometheus_client import CollectorRegistry

from rls.process.server import probe_cache_store
from rls.response_cache.cache import ResponseCache, StoredResponse
from rls.response_cache.config import parse_cache_config
from rls.response_cache.keys import Headers
from rls.response_cache.metrics import CacheMetrics
from rls.response_cache.store import (
    ENTRY_OVERHEAD,
    GuardedStore,
    MemoryCacheStore,
    RedisCacheStore,
    StoreDown,
    StoreError,
    create_store,
)

from .helpers import config
from .stores import SSDB_SAFE, SsdbStore


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
    reply = StoredResponse(200, (("content-type", b"text/plain"),), b"hello", frozenset())
    await cache.save(rk, reply, None)
    hit = await cache.lookup(rk)
    assert hit.entry is not None and hit.entry.body == b"hello"
    await cache.refresh(translate, hit.keys)

    vary_headers = Headers([(":path", b"/items?p=1"), ("accept-language", b"en")])
    vk = cache.request_key(items, "GET", vary_headers, b"")
    await cache.lookup(vk)
    await cache.save(vk, StoredResponse(200, (), b"en", frozenset({"accept-language"})), None)
    vary_hit = await cache.lookup(vk)
    assert vary_hit.entry is not None and vary_hit.entry.body == b"en"
    await cache.refresh(items, vary_hit.keys)

    await cache.purge("translate")
    assert (await cache.lookup(rk)).entry is None
    await store.set("p:" + "k" * 400, b"v", 5)  # bounded to <= 255 bytes
    assert await store.get("p:" + "k" * 400) == b"v"
    await store.close()


def running(server: SsdbStore) -> SsdbStore:
    """The session's SSDB, restarted or thawed if an earlier test left it so."""
    if server.proc.poll() is not None:
        server.start()
    else:
        server.thaw()
    server.flush()
    return server


async def test_ssdb_mode_sends_only_ssdb_safe_commands(ssdb_server: SsdbStore) -> None:
    # Checked on a real SSDB: its debug log names every request it got, handshake included.
    ssdb = running(ssdb_server)
    offset = ssdb.log_offset()
    await exercise(create_store(ssdb.url, timeout_ms=2000))
    sent = ssdb.commands_since(offset)
    assert set(sent) <= SSDB_SAFE, sent  # no HELLO, CLIENT SETINFO, SELECT, SET PX, PEXPIRE
    assert SSDB_SAFE <= set(sent)
    # the version key is written with SETEX (a plain SET would keep an old TTL on SSDB)
    [version_key] = ssdb.keys("rc:v:")
    assert ssdb.ttl(version_key) > 9 * 365 * 86400
    assert all(len(k) <= 255 for k in ssdb.keys("rc:"))


def test_ssdb_log_shows_a_default_redis_py_handshake(ssdb_server: SsdbStore) -> None:
    # The check above can fail: redis-py's defaults (RESP3) open with HELLO, which SSDB
    # rejects, and the log shows it.
    ssdb = running(ssdb_server)
    offset = ssdb.log_offset()
    client = redis.Redis(port=ssdb.port, socket_timeout=5)
    with pytest.raises(redis.RedisError):
        client.get("k")
    client.close()
    assert "hello" in ssdb.commands_since(offset)


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


async def test_a_burst_larger_than_the_pool_waits_for_connections(redis_url: str) -> None:
    store = RedisCacheStore(redis_url, timeout_ms=2000, pool_size=4)
    results = await asyncio.gather(*(store.get(f"k{i}") for i in range(40)))
    assert results == [None] * 40  # none failed with "Too many connections"
    assert not store.down
    await store.close()


@pytest.mark.redis
async def test_pooled_connections_survive_a_store_restart() -> None:
    server = start_redis()
    try:
        store = create_store(server.url, timeout_ms=2000)
        await asyncio.gather(*(store.get(f"k{i}") for i in range(10)))  # 10 pooled connections
        server.stop()
        server = start_redis(port=server.port)
        # every pooled connection is stale now; each reconnects once instead of failing
        assert await asyncio.gather(*(store.get(f"k{i}") for i in range(10))) == [None] * 10
        assert not store.down
        await store.close()
    finally:
        server.stop()


def test_pooled_ssdb_connections_survive_a_store_restart_on_uvloop(
    ssdb_server: SsdbStore,
) -> None:
    """On uvloop (rls serve's loop), a pooled connection to a killed SSDB fails its next write
    with RuntimeError ("the handler is closed"), not ConnectionError: it must be retried on a
    fresh connection like one, or every pooled connection fails a request after a restart."""
    server = running(ssdb_server)

    async def scenario() -> None:
        store = create_store(server.url, timeout_ms=2000)
        await asyncio.gather(*(store.get(f"k{i}") for i in range(10)))  # 10 pooled connections
        server.kill()
        server.start()
        results = await asyncio.gather(*(store.get(f"k{i}") for i in range(10)),
                                       return_exceptions=True)
        await store.close()
        assert results == [None] * 10

    uvloop.run(scenario())


@pytest.mark.redis
async def test_unreachable_store_errors_then_is_marked_down_until_it_answers() -> None:
    port = free_port()
    store = create_store(f"redis://127.0.0.1:{port}/0", timeout_ms=50)
    with pytest.raises(StoreError) as info:
        await store.get("k")
    assert not isinstance(info.value, StoreDown)
    assert info.value.op == "get"
    # the refusal is evidence: the breaker's probe finds the store dead and marks it down
    # polled from a thread: the event loop runs the breaker's probe meanwhile
    await asyncio.to_thread(wait_until, lambda: store.down, 5, "the store marked down")
    with pytest.raises(StoreDown) as down:
        await store.set("k", b"v", 1)
    assert down.value.op == "set"
    server = start_redis(port=port)
    try:  # the probe finds it back: calls go to the store again
        await asyncio.to_thread(wait_until, lambda: not store.down, 5, "the store marked up")
        await store.set("k", b"v", 1)
        assert await store.get("k") == b"v"
    finally:
        await store.close()
        server.stop()


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


async def test_memory_store_is_an_lru_bounded_in_bytes() -> None:
    store = MemoryCacheStore(timeout_ms=200, max_bytes=3 * (ENTRY_OVERHEAD + 2 + 1000))
    metrics = CacheMetrics()
    store.bind_metrics(metrics)
    for key in ("k1", "k2", "k3"):
        await store.set(key, b"x" * 1000, 60)
    assert store.size == 3 * (ENTRY_OVERHEAD + 2 + 1000)
    assert await store.get("k1") == b"x" * 1000  # k1 is now the most recently used
    await store.set("k4", b"y" * 1000, 60)  # evicts k2, the least recently used
    assert await store.get("k2") is None
    assert [await store.get(k) is not None for k in ("k1", "k3", "k4")] == [True] * 3
    assert store.size <= store.max_bytes
    assert metrics.memory_evictions._value.get() == 1
    gauge = metrics.registry.get_sample_value("rls_cache_memory_store_bytes")
    assert gauge == store.size  # the gauge reads the store

    await store.set("big", b"z" * store.max_bytes, 60)  # larger than the whole budget
    assert await store.get("big") is None
    assert metrics.memory_evictions._value.get() == 2
    await store.set("k1", b"short", 60)  # overwrite: the size follows the new value
    assert store.size == 2 * (ENTRY_OVERHEAD + 2 + 1000) + ENTRY_OVERHEAD + 2 + 5


async def test_memory_store_never_evicts_purge_versions() -> None:
    store = MemoryCacheStore(timeout_ms=200, max_bytes=ENTRY_OVERHEAD + 100)
    await store.set_version("rc:v:translate", b"abc")
    for i in range(20):
        await store.set(f"e{i}", b"v" * 50, 60)
    assert await store.get_version("rc:v:translate") == b"abc"
    assert len(store.data) == 1


async def test_memory_budget_comes_from_the_rules_file() -> None:
    from rls.services.extproc import build_cache

    text = "memory_max_bytes: 2MiB\nrules:\n- api: items\n"
    registry = CollectorRegistry()
    config = parse_cache_config("x.yaml", text)
    _service, cache = build_cache("x.yaml", None, registry, config=config)
    assert isinstance(cache.store, MemoryCacheStore)
    assert cache.store.max_bytes == 2 << 20
    await cache.store.set("k", b"v", 5)
    assert registry.get_sample_value("rls_cache_memory_store_bytes") == ENTRY_OVERHEAD + 2


async def test_an_unreachable_store_at_startup_is_logged_without_its_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = create_store(f"redis://:hunter2@127.0.0.1:{free_port()}/0", timeout_ms=50)
    with caplog.at_level(logging.WARNING, logger="rls.server"):
        await probe_cache_store(store)
    await store.close()
    assert "unreachable at startup" in caplog.text
    assert "hunter2" not in caplog.text and ":***@127.0.0.1" in caplog.text
