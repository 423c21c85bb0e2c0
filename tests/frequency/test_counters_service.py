"""Counters service (issue 17): Add/Get with per-call windows on the memory store and a real
redis-server; calendar bounds from the store's clock; batches; stale and hot-key reads."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
import redis.asyncio as aioredis
from conftest import start_redis
from prometheus_client import CollectorRegistry

from rls.frequency.model import (
    CountersConfig,
    DomainOptions,
    InvalidItem,
    item_from_json,
    load_config,
    make_item,
)
from rls.frequency.service import CountersService
from rls.frequency.storage import CounterStoreError, MemoryCounterStore, RedisCounterStore
from rls.stores.redis import RedisBackend

SH = ZoneInfo("Asia/Shanghai")


def ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


CFG = CountersConfig(domains={"ads": DomainOptions("Asia/Shanghai", ""),
                              "hashed": DomainOptions("UTC", "md5")})


def item(key="u1", span=1, unit="day", hits=1, domain="ads", tz="", window="calendar"):
    return make_item(CFG, domain, key, span, unit, hits, tz, window)


@pytest.fixture(params=["memory", "redis"])
async def service(request):
    """The same behaviour on both stores (Redis: a flushed real redis-server)."""
    if request.param == "memory":
        svc = CountersService(MemoryCounterStore(), CFG, CollectorRegistry())
        yield svc
        return
    url = request.getfixturevalue("redis_url")
    backend = RedisBackend(url)
    svc = CountersService(RedisCounterStore(backend), CFG, CollectorRegistry())
    yield svc
    await backend.close()


async def test_add_answers_count_and_seconds_left_in_natural_day(service):
    now = ms(datetime(2026, 3, 10, 23, 59, 30, tzinfo=SH))
    (r,) = await service.add([item(hits=2)], now)
    assert (r.code, r.freq, r.ttl) == ("ok", 2, 30)
    (r,) = await service.add([item(hits=3)], now + 1000)
    assert (r.freq, r.ttl) == (5, 29)
    (g,) = await service.get([item()], now + 2000)
    assert (g.freq, g.ttl, g.stale) == (5, 28, False)
    # Local midnight in Shanghai opens a new natural day.
    (n,) = await service.get([item()], ms(datetime(2026, 3, 11, 0, 0, 1, tzinfo=SH)))
    assert (n.freq, n.ttl) == (0, 86_399)


async def test_get_does_not_charge(service):
    now = ms(datetime(2026, 3, 10, 12, tzinfo=SH))
    for _ in range(3):
        (g,) = await service.get([item(key="g")], now)
        assert g.freq == 0
    (a,) = await service.add([item(key="g")], now)
    assert a.freq == 1


@pytest.mark.parametrize(
    ("unit", "span", "at", "ttl"),
    [
        ("second", 10, datetime(2026, 3, 10, 12, 0, 7), 3),
        ("minute", 5, datetime(2026, 3, 10, 12, 3, 0), 120),
        ("hour", 1, datetime(2026, 3, 10, 12, 59, 0), 60),
        # 2 natural days: blocks counted from 1970-01-01 local; 2026-03-10 starts a block.
        ("day", 2, datetime(2026, 3, 11, 12, 0, 0), 12 * 3600),
        # natural week: Monday 00:00; 2026-03-15 is a Sunday.
        ("week", 1, datetime(2026, 3, 15, 23, 0, 0), 3600),
        ("month", 1, datetime(2026, 2, 28, 22, 0, 0), 2 * 3600),
    ],
)
async def test_window_units_in_timezone(service, unit, span, at, ttl):
    now = ms(at.replace(tzinfo=SH))
    (r,) = await service.add([item(key=f"w-{unit}", unit=unit, span=span)], now)
    assert (r.freq, r.ttl) == (1, ttl)


async def test_per_call_timezone_overrides_domain(service):
    # 20:00 UTC on 10 March is already 11 March in Shanghai: two different natural days.
    now = ms(datetime(2026, 3, 10, 20, 0, tzinfo=ZoneInfo("UTC")))
    (utc,) = await service.add([item(key="tz", tz="UTC")], now)
    (sh,) = await service.add([item(key="tz")], now)
    assert utc.ttl == 4 * 3600 and sh.ttl == 20 * 3600  # 04:00 in Shanghai
    assert utc.freq == 1 and sh.freq == 1


async def test_rolling_window_starts_at_first_hit(service):
    t0 = ms(datetime(2026, 3, 10, 12, 34, 56, tzinfo=SH))
    it = item(key="roll", unit="hour", window="rolling_from_first_hit")
    (g,) = await service.get([it], t0)
    assert (g.freq, g.ttl) == (0, 0)  # no window open before the first hit
    (a,) = await service.add([it], t0)
    assert (a.freq, a.ttl) == (1, 3600)


async def test_batch_answers_in_order_and_counts_duplicates(service):
    now = ms(datetime(2026, 3, 10, 12, tzinfo=SH))
    batch = [item(key=f"b{i % 10}") for i in range(30)]
    results = await service.add(batch, now)
    assert [r.freq for r in results] == [1] * 10 + [2] * 10 + [3] * 10
    got = await service.get(batch[:10], now)
    assert [r.freq for r in got] == [3] * 10


async def test_batch_over_30_items_is_invalid(service):
    with pytest.raises(InvalidItem):
        await service.add([item(key=str(i)) for i in range(31)])


def test_invalid_items_are_refused_before_any_store_call():
    for bad in (
        {"domain": "", "key": "k", "time_unit": "day"},
        {"domain": "d", "key": "k", "time_unit": "fortnight"},
        {"domain": "d", "key": "k", "time_unit": "day", "time_span": 0},
        {"domain": "d", "key": "k", "time_unit": "day", "hits": -1},
        {"domain": "d", "key": "k", "time_unit": "day", "timezone": "Mars/Base"},
        {"domain": "d", "key": "k", "time_unit": "month", "window": "rolling_from_first_hit"},
        {"domain": "d", "key": "k", "time_unit": "day", "extra": 1},
    ):
        with pytest.raises(InvalidItem):
            item_from_json(CFG, bad)
    ok = item_from_json(CFG, {"appid": "ads", "key": "k", "time_unit": "DAY"})
    assert ok.timezone == "Asia/Shanghai" and ok.span == 1 and ok.hits == 1


def test_keys_are_injective_and_hashed_keys_fixed_length():
    a = make_item(CFG, "a_b", "c", 1, "day").base_key("rl:")
    b = make_item(CFG, "a", "b_c", 1, "day").base_key("rl:")
    assert a != b
    short = make_item(CFG, "hashed", "x", 1, "day").base_key("rl:")
    long = make_item(CFG, "hashed", "x" * 1000, 1, "day").base_key("rl:")
    assert len(short) == len(long) and "x" * 10 not in long


async def test_hashed_key_keeps_original_in_listing(service):
    now = None  # store clock
    await service.add([item(domain="hashed", key="user:42:impressions")], now)
    listed = (await service.listing("hashed"))["counters"]
    assert [c["original"] for c in listed] == ["user:42:impressions"]
    assert "user:42" not in listed[0]["key"] and listed[0]["freq"] == 1


def test_counters_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "default_timezone: Europe/Paris\n"
        "domains:\n  ads: {timezone: Asia/Shanghai, key_hash: md5}\n"
        "hot_keys: {top_n: 5, threshold_per_second: 10, ttl_ms: 500}\n"
    )
    cfg = load_config(str(path))
    assert cfg.options("ads") == DomainOptions("Asia/Shanghai", "md5")
    assert cfg.options("other").timezone == "Europe/Paris"
    assert (cfg.hot_top_n, cfg.hot_threshold, cfg.hot_ttl_ms) == (5, 10.0, 500)
    for bad, why in (
        ("domains:\n  ads: {key_hash: sha1}\n", "key_hash"),
        ("hot_keys: {ttl_ms: 5000}\n", "ttl_ms"),
        ("default_timezone: Mars/Base\n", "time zone"),
        ("colour: blue\n", "unknown"),
    ):
        path.write_text(bad)
        with pytest.raises(ValueError, match=why):
            load_config(str(path))


def test_xxh3_keys_need_the_xxhash_package(tmp_path, monkeypatch):
    import rls.core.keys as keys

    path = tmp_path / "c.yaml"
    path.write_text("domains:\n  ads: {key_hash: xxh3}\n")
    monkeypatch.setattr(keys, "_xxh3", None)
    with pytest.raises(ValueError, match="xxhash"):
        load_config(str(path))
    monkeypatch.setattr(keys, "_xxh3", lambda data: hashlib.md5(data).hexdigest()[::-1])
    cfg = load_config(str(path))
    a = make_item(cfg, "ads", "k" * 500, 1, "day").base_key("rl:")
    b = make_item(cfg, "ads", "k", 1, "day").base_key("rl:")
    assert len(a) == len(b) and ":xxh332:" in a


async def test_rolling_window_rolls_over_after_its_length():
    svc = CountersService(MemoryCounterStore(), CFG, CollectorRegistry())
    it = item(key="roll2", unit="minute", span=10, window="rolling_from_first_hit")
    t0 = 1_764_000_000_123
    assert (await svc.add([it], t0))[0].ttl == 600
    (second,) = await svc.add([it], t0 + 599_000)
    assert (second.freq, second.ttl) == (2, 1)  # anchored at the first hit, not extended
    (fresh,) = await svc.add([it], t0 + 600_000)
    assert (fresh.freq, fresh.ttl) == (1, 600)


async def test_redis_rolling_window_keeps_its_first_hit_expiry(redis_url):
    backend = RedisBackend(redis_url)
    client = backend.client
    try:
        svc = CountersService(RedisCounterStore(backend), CFG, CollectorRegistry())
        it = item(key="roll3", unit="hour", window="rolling_from_first_hit")
        await svc.add([it])
        key = it.base_key("rl:") + ":r"
        await client.pexpire(key, 1500)  # as if 3598.5 s had passed since the first hit
        (second,) = await svc.add([it])
        assert (second.freq, second.ttl) == (2, 2)
        assert 0 < await client.pttl(key) <= 1500
    finally:
        await backend.close()


# --- Redis specifics -------------------------------------------------------------------------


async def test_redis_calendar_bounds_follow_store_clock_not_host(redis_url, monkeypatch):
    """Our host clock is a full day behind; the script still counts in the store's day."""
    import rls.frequency.storage as stores

    backend = RedisBackend(redis_url)

    client = backend.client
    try:
        sec, _ = await client.time()
        store = RedisCounterStore(backend)
        svc = CountersService(store, CFG, CollectorRegistry())
        it = item(key="skew", tz="UTC")
        (right,) = await svc.add([it])
        monkeypatch.setattr(stores.time, "time", lambda: sec - 86_400 * 1.5)
        (skewed,) = await svc.add([it])
        assert skewed.freq == right.freq + 1  # the same (store's) day, not yesterday's key
        midnight = (sec // 86_400 + 1) * 86_400
        assert abs(skewed.ttl - (midnight - sec)) <= 2
    finally:
        await backend.close()


async def test_redis_per_item_failure_is_reported_on_that_item(redis_url):
    backend = RedisBackend(redis_url)
    client = backend.client
    try:
        svc = CountersService(RedisCounterStore(backend), CFG, CollectorRegistry())
        good, bad = item(key="good", tz="UTC"), item(key="bad", tz="UTC")
        sec, _ = await client.time()
        start = sec // 86_400 * 86_400 * 1000
        await client.set(bad.base_key("rl:") + f":{start}", "not a hash")
        results = await svc.add([good, bad])
        assert results[0].code == "ok" and results[0].freq == 1
        assert results[1].code == "unavailable" and "WRONGTYPE" in results[1].message
    finally:
        await backend.close()


@pytest.mark.redis
async def test_redis_down_add_raises_and_get_answers_last_known_value_stale():
    own = start_redis()
    backend = RedisBackend(own.url)
    registry = CollectorRegistry()
    svc = CountersService(RedisCounterStore(backend, timeout_s=0.5), CFG, registry)
    it = item(key="s", tz="UTC")
    try:
        (a,) = await svc.add([it])
        await svc.add([it])
        own.stop()
        with pytest.raises(CounterStoreError):
            await svc.add([it])
        (g,) = await svc.get([it])
        assert (g.code, g.freq, g.stale) == ("ok", a.freq + 1, True)
        assert registry.get_sample_value("rls_counters_stale_answers_total") == 1
        (unknown,) = await svc.get([item(key="never-seen", tz="UTC")])
        assert unknown.code == "unavailable" and not unknown.stale
    finally:
        own.stop()
        await backend.close()


async def test_stale_cache_is_bounded_in_entries_and_bytes():
    from rls.frequency.local_answers import StaleCache
    from rls.frequency.model import Result

    cache = StaleCache(max_entries=10, max_bytes=10_000)
    for i in range(50):
        cache.remember(f"k{i}", Result(freq=i, ttl_ms=1000), 0)
    assert len(cache) == 10 and cache.answer("k0", 0) is None and cache.answer("k49", 0)
    small = StaleCache(max_entries=1000, max_bytes=1000)
    for i in range(50):
        small.remember("x" * 100 + str(i), Result(freq=i, ttl_ms=1000), 0)
    assert small.bytes <= 1000 and len(small) < 50


HOT_CFG = CountersConfig(hot_top_n=10, hot_threshold=1, hot_ttl_ms=1000)
CHANNEL = "rl:counters:changed:"


@dataclass
class Replicas:
    """Replica A (caches hot counters, follows invalidations) and replica B (writes)."""

    a: CountersService
    b: CountersService
    ca: aioredis.Redis
    cb: aioredis.Redis


@pytest.fixture
async def replicas(redis_url):
    ba, bb = RedisBackend(redis_url), RedisBackend(redis_url)
    ca, cb = ba.client, bb.client
    a = CountersService(RedisCounterStore(ba, channel=CHANNEL), HOT_CFG, CollectorRegistry(),
                        subscriber=ca)
    b = CountersService(RedisCounterStore(bb, channel=CHANNEL), HOT_CFG, CollectorRegistry())
    await a.start()
    try:
        yield Replicas(a, b, ca, cb)
    finally:
        await a.close()
        await ba.close()
        await bb.close()


async def test_hot_key_served_locally_and_invalidated_by_other_replicas_add(replicas):
    """Replica A caches a hot counter; replica B's Add publishes it and A drops the entry."""
    a, b, ca, cfg = replicas.a, replicas.b, replicas.ca, HOT_CFG
    it = make_item(cfg, "d", "hot", 1, "hour")
    await b.add([it])
    clock = [1000.0]
    a.hot._clock = lambda: clock[0]
    a.hot._second = 1000
    for _ in range(5):
        await a.get([it])
    clock[0] = 1001.0  # next second: the counter is hot now…
    await a.get([it])
    ident = it.base_key("rl:")
    for _ in range(500):  # …and cached once its invalidation channel is subscribed
        if a.hot.watched and ident in a.hot.watched:
            break
        await asyncio.sleep(0.01)
    assert a.hot.watched is not None and ident in a.hot.watched
    (first,) = await a.get([it])  # from the store, remembered
    await ca.delete(*(await ca.keys("rl:c*")))  # the store changes behind our back…
    (cached,) = await a.get([it])
    assert cached.freq == first.freq == 1  # …the hot answer is local
    assert a.metrics.hot_answers._value.get() >= 1
    # B's Add must drop A's entry (repeated until A's subscription delivers one)
    seen = a.metrics.invalidations._value.get()
    heavy = make_item(cfg, "d", "hot", 1, "hour", hits=5)
    for _ in range(500):
        await b.add([heavy])
        await asyncio.sleep(0.01)
        if a.metrics.invalidations._value.get() != seen:
            break
    (after,) = await a.get([it])
    (truth,) = await b.get([it])
    assert after.freq == truth.freq >= 5


async def test_redis_batch_of_30_is_one_script_call(redis_url):
    backend = RedisBackend(redis_url)
    client = backend.client
    try:
        svc = CountersService(RedisCounterStore(backend), CFG, CollectorRegistry())
        batch = [item(key=f"one{i}", unit=("day", "hour")[i % 2]) for i in range(30)]
        await svc.add(batch[:1])  # loads the script
        await client.config_resetstat()
        await svc.add(batch)
        await svc.get(batch)
        stats = await client.info("commandstats")
        assert stats["cmdstat_evalsha"]["calls"] == 2
        assert "cmdstat_hincrby" in stats  # the script did the work
    finally:
        await backend.close()


async def test_adds_to_counters_nobody_caches_send_no_invalidation(replicas):
    """Invalidations go per counter channel: a replica caching nothing receives nothing, however
    many Adds other replicas make (each used to parse one message per Add of every replica)."""
    a, b, cb, cfg, channel = replicas.a, replicas.b, replicas.cb, HOT_CFG, CHANNEL
    for _ in range(100):  # until A's subscription is up: its idle channel is listed
        if await cb.pubsub_numsub(channel + "\x00idle") == [(
                (channel + "\x00idle").encode(), 1)]:
            break
        await asyncio.sleep(0.01)
    await b.add([make_item(cfg, "d", f"cold{i}", 1, "hour") for i in range(30)])
    # a marker A does subscribe to shows that anything sent before it was delivered
    marker = make_item(cfg, "d", "marker", 1, "hour")
    a.hot.hot = frozenset({marker.base_key("rl:")})
    for _ in range(500):
        if a.hot.watched and marker.base_key("rl:") in a.hot.watched:
            break
        await asyncio.sleep(0.01)
    await b.add([marker])
    for _ in range(500):
        if a.metrics.invalidations._value.get() >= 1:
            break
        await asyncio.sleep(0.01)
    assert a.metrics.invalidations._value.get() == 1  # the marker's, none for the 30
