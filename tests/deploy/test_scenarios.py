"""The field scenarios of DESIGN §9, replayed against config/scenario-*.yaml as shipped.

Two ways, each where it fits:
- the in-process RateLimiter with injected time (`now_ms`), on the memory backend and on a
  real Redis (Lua scripts), for stories that span hours or days (window resets, borrowing,
  Shanghai midnight) or need exact timestamps (the sliding log compared with a model);
- a real `rls serve` (tests/conftest.py rls_factory) for what goes over the wire: gRPC
  ShouldRateLimit with weighted hits, the admin API (`POST /add`, `POST /counters`,
  `GET /usage`), the CLI clients, and two replicas sharing one Redis under concurrent load.

Real-server stories use the real clock; `avoid_window_edge` keeps each inside one window.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis

from rls.config.loader import load_paths
from rls.engine.limiter import OK, OVER_LIMIT, Decision, DescriptorIn, RateLimiter
from rls.observability.metrics import Metrics
from rls.settings import Settings
from rls.stores.memory import MemoryBackend
from rls.stores.redis import RedisBackend

from .helpers import OK as GRPC_OK
from .helpers import (
    OVER,
    RlsClient,
    admin,
    avoid_window_edge,
    descriptor,
    rl_request,
    scenario,
)

T_HOUR = 1_699_999_200_000  # 2023-11-14 22:00:00 UTC, aligned to the hour
assert T_HOUR % 3_600_000 == 0
MINUTE = 60_000
HOUR = 3_600_000
SHANGHAI = ZoneInfo("Asia/Shanghai")

Entries = tuple[tuple[str, str], ...]


def D(entries: Entries, hits: int | None = None) -> DescriptorIn:
    return DescriptorIn(tuple(entries), hits=hits)


async def decide(
    lim: RateLimiter, domain: str, *descs: DescriptorIn, now_ms: int, calls: int = 0
) -> Decision:
    """One request; `calls` > 1 weighs it as that many calls (the request-level hits_addend, a
    plain weight: charged all or nothing, unlike a descriptor's own cost)."""
    return await lim.should_rate_limit(domain, list(descs), calls, now_ms=now_ms)


async def used(lim: RateLimiter, domain: str, entries: Entries, now_ms: int) -> dict[str, int]:
    """Limit name -> usage of one descriptor, read without charging (what /counters shows)."""
    (limits,) = await lim.query(domain, [D(entries)], now_ms=now_ms)
    return {limit.name: outcome.used for limit, outcome in limits}


def shanghai_ms(*args: int) -> int:
    return int(datetime(*args, tzinfo=SHANGHAI).timestamp() * 1000)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(params=["memory", "redis"])
def store_url(request: pytest.FixtureRequest) -> str | None:
    """None for the embedded memory backend, else the URL of a flushed test Redis."""
    if request.param == "memory":
        return None
    return request.getfixturevalue("redis_url")


@pytest.fixture
async def limiter_for(store_url: str | None) -> AsyncIterator[Callable[[str], RateLimiter]]:
    """RateLimiter over config/scenario-<name>.yaml on the parametrized backend.

    The local over-limit cache is off: it runs on the real clock, and these stories travel
    in injected time.
    """
    backends: list[Any] = []

    def make(name: str) -> RateLimiter:
        config = load_paths([str(scenario(name))])
        if store_url is None:
            backend: Any = MemoryBackend(sweep_interval=0)
        else:
            backend = RedisBackend(store_url, timeout_ms=2000, connect_timeout_ms=2000)
        backends.append(backend)
        settings = Settings(backend_timeout_ms=2000, local_cache=False)
        return RateLimiter(lambda: config, backend, settings, Metrics())

    yield make
    for backend in backends:
        await backend.close()


def serve_args(store_url: str | None) -> tuple[str, ...]:
    # A generous store deadline: on a loaded test machine the default 15 ms would let the
    # failure mode answer some calls, and those are neither charged nor counted in usage.
    return () if store_url is None else ("--redis-url", store_url, "--backend-timeout-ms", "2000")


# --------------------------------------------------------------------------- 1. gateway


async def test_gateway_quota_per_api_and_user_and_translation_weighted_by_bytes(limiter_for):
    """§9.1: per API+user per minute; translation charged by payload bytes (20,000/minute).

    A payload larger than what is left is rejected whole and charges nothing, so a smaller
    one still fits; users and APIs have separate counters; the next minute starts afresh.
    """
    lim = limiter_for("gateway")
    dom = "api_gateway"
    t = T_HOUR + 5_000
    alice_tr = (("api", "translate"), ("user", "alice"))

    r = await decide(lim, dom, D(alice_tr, 8000), now_ms=t)
    assert r.overall == OK and r.statuses[0].remaining == 12000
    assert r.statuses[0].limit.name == "translate_bytes_per_user_minute"
    r = await decide(lim, dom, D(alice_tr, 8000), now_ms=t + 1)
    assert r.overall == OK and r.statuses[0].remaining == 4000
    r = await decide(lim, dom, D(alice_tr, 5000), now_ms=t + 2)
    assert r.overall == OVER_LIMIT and r.statuses[0].remaining == 0
    assert r.statuses[0].reset_seconds == 55
    r = await decide(lim, dom, D(alice_tr, 3000), now_ms=t + 3)  # the 5000 charged nothing
    assert r.overall == OK and r.statuses[0].remaining == 1000
    r = await decide(lim, dom, D((("api", "translate"), ("user", "bob")), 20000), now_ms=t + 4)
    assert r.overall == OK and r.statuses[0].remaining == 0
    r = await decide(lim, dom, D(alice_tr, 20000), now_ms=t + MINUTE)
    assert r.overall == OK, "a new minute starts with the full 20,000 bytes"

    # Plain APIs: 60 calls per user per API per minute (search: 30).
    alice_orders = (("api", "orders"), ("user", "alice"))
    for i in range(60):
        r = await decide(lim, dom, D(alice_orders), now_ms=t + 10 + i)
        assert r.overall == OK, i
    r = await decide(lim, dom, D(alice_orders), now_ms=t + 100)
    assert r.overall == OVER_LIMIT
    assert r.statuses[0].limit.name == "calls_per_api_user_minute"
    assert (await decide(lim, dom, D((("api", "profile"), ("user", "alice"))), now_ms=t + 101)
            ).overall == OK, "another API of the same user has its own quota"
    assert (await decide(lim, dom, D((("api", "orders"), ("user", "bob"))), now_ms=t + 102)
            ).overall == OK, "another user of the same API has its own quota"
    alice_search = (("api", "search"), ("user", "alice"))
    r = await decide(lim, dom, D(alice_search, 30), now_ms=t + 200)
    assert r.overall == OK and r.statuses[0].limit.requests_per_unit == 30
    assert (await decide(lim, dom, D(alice_search), now_ms=t + 201)).overall == OVER_LIMIT


def test_gateway_weighted_hits_over_grpc(rls_factory):
    """§9.1 over the wire: Envoy's per-descriptor hits_addend (payload bytes) on a real server.

    One request carrying an exhausted translation descriptor and a plain API descriptor is
    rejected whole: the plain API's counter is not charged either.
    """
    rls = rls_factory(scenario("gateway"))
    client = RlsClient(rls.grpc_addr)
    avoid_window_edge(60, 3)
    tr = (("api", "translate"), ("user", "carol"))
    items = (("api", "items"), ("user", "carol"))

    resp = client.call("api_gateway", descriptor(tr, hits=15000))
    assert resp.overall_code == GRPC_OK
    st = resp.statuses[0]
    assert st.limit_remaining == 5000
    assert st.current_limit.name == "translate_bytes_per_user_minute"
    assert st.current_limit.requests_per_unit == 20000
    assert 0 < st.duration_until_reset.seconds <= 60

    resp = client.call("api_gateway", descriptor(tr, hits=6000))
    assert resp.overall_code == OVER and resp.statuses[0].limit_remaining == 0
    resp = client.call("api_gateway", descriptor(tr, hits=5000))
    assert resp.overall_code == GRPC_OK and resp.statuses[0].limit_remaining == 0

    resp = client.call("api_gateway", descriptor(items))
    assert resp.overall_code == GRPC_OK and resp.statuses[0].limit_remaining == 59
    resp = client.call("api_gateway", descriptor(tr, hits=1), descriptor(items))
    assert resp.overall_code == OVER
    assert resp.statuses[1].code == GRPC_OK and resp.statuses[1].limit_remaining == 59
    resp = client.call("api_gateway", descriptor(items))
    assert resp.statuses[0].limit_remaining == 58, "the rejected request charged nothing"
    client.close()


# --------------------------------------------------------------------------- 2. open platform


async def test_open_platform_app_ip_and_app_user_interface_at_once(limiter_for):
    """§9.2: 10,000/hour per app+IP and 1,000/hour per app+user+interface, checked together.

    Weighted calls keep it fast: 10,000 calls then 1 is the 10,001st call of the hour.
    """
    lim = limiter_for("open-platform")
    dom = "open_platform"
    t = T_HOUR + MINUTE
    app_ip = (("app", "42"), ("ip", "10.0.0.1"))

    r = await decide(lim, dom, D(app_ip), calls=10000, now_ms=t)
    assert r.overall == OK and r.statuses[0].remaining == 0
    r = await decide(lim, dom, D(app_ip), now_ms=t + 1)
    assert r.overall == OVER_LIMIT, "the 10,001st call in the hour"
    assert r.statuses[0].limit.name == "app_ip_per_hour"
    assert r.statuses[0].reset_seconds == 3540
    r = await decide(lim, dom, D((("app", "42"), ("ip", "10.0.0.2"))), now_ms=t + 2)
    assert r.overall == OK and r.statuses[0].remaining == 9999, "another IP goes through"
    r = await decide(lim, dom, D((("app", "7"), ("ip", "10.0.0.1"))), now_ms=t + 3)
    assert r.overall == OK, "another app from the same IP goes through"

    # Both limits on one call: the tighter one decides, and a rejection charges neither.
    ip2 = (("app", "42"), ("ip", "10.0.0.2"))
    send = (("app", "42"), ("user", "u1"), ("interface", "send_msg"))
    r = await decide(lim, dom, D(ip2), D(send), calls=1000, now_ms=t + 10)
    assert r.overall == OK
    assert [s.remaining for s in r.statuses] == [8999, 0]
    r = await decide(lim, dom, D(ip2), D(send), now_ms=t + 11)
    assert r.overall == OVER_LIMIT
    assert r.statuses[0].code == OK and r.statuses[0].remaining == 8999
    assert r.statuses[1].code == OVER_LIMIT
    assert r.statuses[1].limit.name == "app_user_interface_per_hour"
    assert await used(lim, dom, ip2, t + 12) == {"app_ip_per_hour": 1001}
    other_interface = (("app", "42"), ("user", "u1"), ("interface", "get_user"))
    r = await decide(lim, dom, D(ip2), D(other_interface), now_ms=t + 13)
    assert r.overall == OK

    r = await decide(lim, dom, D(app_ip), now_ms=T_HOUR + HOUR)
    assert r.overall == OK and r.statuses[0].remaining == 9999, "the next hour starts afresh"


async def test_open_platform_borrowing_1200_in_hour_one_leaves_800_for_hour_two(limiter_for):
    """§9.2 borrowing: 1000/hour with overdraft 300 (README, `overdraft`)."""
    lim = limiter_for("open-platform")
    dom = "open_platform"
    trial = (("plan", "trial"), ("app", "42"))
    hour1, hour2, hour3 = T_HOUR + 1000, T_HOUR + HOUR + 1000, T_HOUR + 2 * HOUR + 1000

    r = await decide(lim, dom, D(trial), calls=1000, now_ms=hour1)
    assert r.overall == OK and r.statuses[0].remaining == 300
    r = await decide(lim, dom, D(trial), calls=200, now_ms=hour1 + 1)
    assert r.overall == OK and r.statuses[0].remaining == 100
    r = await decide(lim, dom, D(trial), calls=101, now_ms=hour1 + 2)
    assert r.overall == OVER_LIMIT, "at most 1,300 in an hour that starts free of debt"
    assert await used(lim, dom, trial, hour1 + 3) == {"trial_app_per_hour": 1200}

    (limits,) = await lim.query(dom, [D(trial)], now_ms=hour2)
    ((_, outcome),) = limits
    assert (outcome.used, outcome.remaining) == (200, 800), "the 200 borrowed are owed"
    r = await decide(lim, dom, D(trial), calls=800, now_ms=hour2 + 1)
    assert r.overall == OK and r.statuses[0].remaining == 0
    r = await decide(lim, dom, D(trial), now_ms=hour2 + 2)
    assert r.overall == OVER_LIMIT, "an hour that repays debt may not borrow"

    r = await decide(lim, dom, D(trial), calls=1300, now_ms=hour3)
    assert r.overall == OK, "hour 3 starts free of debt and may borrow again"
    assert (await decide(lim, dom, D(trial), now_ms=hour3 + 1)).overall == OVER_LIMIT


def test_open_platform_usage_statistics_over_the_admin_api(rls_factory, store_url):
    """§9.2 daily statistics: calls per app, per app+interface, distinct users per app.

    Every call counts, admitted or not. Read with `GET /usage` and the `rls usage` client.
    """
    rls = rls_factory(scenario("open-platform"), args=serve_args(store_url))
    client = RlsClient(rls.grpc_addr)
    avoid_window_edge(3600, 3)
    avoid_window_edge(86400, 60, offset_s=8 * 3600)  # stay inside one Shanghai day
    day = datetime.now(SHANGHAI).strftime("%Y%m%d")
    calls = [
        ("42", "u1", "send_msg", "10.0.0.1"),
        ("42", "u2", "send_msg", "10.0.0.1"),
        ("42", "u1", "get_user", "10.0.0.2"),
        ("42", "u3", "send_msg", "10.0.0.3"),
        ("42", "u2", "get_user", "10.0.0.1"),
        ("43", "u1", "send_msg", "10.0.0.9"),
    ]
    for app, user, interface, ip in calls:
        resp = client.call(
            "open_platform",
            descriptor((("app", app), ("ip", ip))),
            descriptor((("app", app), ("user", user), ("interface", interface))),
        )
        assert resp.overall_code == GRPC_OK
    rejected = client.call(
        "open_platform",
        descriptor((("app", "42"), ("ip", "10.0.0.4"))),
        descriptor((("app", "42"), ("user", "u4"), ("interface", "send_msg")), hits=1001),
    )
    assert rejected.overall_code == OVER
    assert datetime.now(SHANGHAI).strftime("%Y%m%d") == day, "the story left its Shanghai day"

    path = f"/usage?domain=open_platform&day={day}"
    status, body = admin(rls.http_url, "GET", path + "&app=42")
    assert (status, body["calls"]) == (200, 6), body
    assert admin(rls.http_url, "GET", path + "&app=43")[1]["calls"] == 1
    assert admin(rls.http_url, "GET", path + "&app=42&interface=send_msg")[1]["calls"] == 4
    assert admin(rls.http_url, "GET", path + "&interface=get_user&app=42")[1]["calls"] == 2
    status, body = admin(rls.http_url, "GET", path + "&distinct=user&app=42")
    assert (status, body["distinct"]) == (200, 4)
    assert admin(rls.http_url, "GET", path + "&distinct=user&app=43")[1]["distinct"] == 1
    # `day` defaults to today in the statistics' time zone (Asia/Shanghai).
    assert admin(rls.http_url, "GET", "/usage?domain=open_platform&app=42")[1]["day"] == day
    assert admin(rls.http_url, "GET", path + "&user=u1")[0] == 404  # no such statistic
    assert admin(rls.http_url, "GET", "/usage?domain=payments&app=42")[0] == 404

    out = subprocess.run(
        [sys.executable, "-m", "rls", "usage", "--admin", rls.http_url,
         "--domain", "open_platform", "--day", day, "--distinct", "user", "app=42"],
        capture_output=True, text=True, timeout=30, check=True,
    )
    assert json.loads(out.stdout)["distinct"] == 4
    client.close()


# --------------------------------------------------------------------------- 3. ads


def test_ads_frequency_counts_and_ttl_without_charging_in_batches_of_30(rls_factory, store_url):
    """§9.3: charge impressions with `POST /add`, then read 30 counters in one `POST /counters`.

    The query reports, per limit, the count and the seconds to reset (the natural-day limit
    resets at the next Shanghai midnight) and charges nothing; 31 descriptors are refused.
    """
    rls = rls_factory(scenario("ads-frequency"), args=serve_args(store_url))
    avoid_window_edge(86400, 10, offset_s=8 * 3600)  # not across midnight in Shanghai
    avoid_window_edge(30, 5)
    keys = [f"user{i}:campaign{i % 3}" for i in range(30)]
    counts = {key: i % 4 for i, key in enumerate(keys)}
    items = [
        rl_request("ads_frequency", [(("appid", "news"), ("key", key))])
        for key, n in counts.items()
        for _ in range(n)
    ]
    for start in range(0, len(items), 30):
        status, body = admin(rls.http_url, "POST", "/add", {"items": items[start:start + 30]})
        assert status == 200, body
        assert {r["overallCode"] for r in body["results"]} == {"OK"}
    # A 4th impression within 30 seconds is refused (and not counted).
    status, body = admin(rls.http_url, "POST", "/add", {"items": [
        rl_request("ads_frequency", [(("appid", "news"), ("key", keys[3]))])]})
    assert status == 200 and body["results"][0]["overallCode"] == "OVER_LIMIT"

    query = rl_request("ads_frequency", [(("appid", "news"), ("key", key)) for key in keys])
    now = datetime.now(SHANGHAI)
    midnight = datetime(now.year, now.month, now.day, tzinfo=SHANGHAI) + timedelta(days=1)
    to_midnight = (midnight - now).total_seconds()
    status, first = admin(rls.http_url, "POST", "/counters", query)
    assert status == 200, first
    assert len(first["results"]) == 30
    for key, result in zip(keys, first["results"], strict=True):
        assert result["entries"][1] == {"key": "key", "value": key}
        limits = {limit["name"]: limit for limit in result["limits"]}
        short, day = limits["per_30_seconds"], limits["per_natural_day"]
        n = counts[key]
        assert (short["used"], day["used"]) == (n, n), key
        assert short["unit"] == "SECOND" and short["unit_multiplier"] == 30
        assert short["remaining"] == 3 - n and short["over_limit"] == (n == 3)
        assert day["remaining"] == 10 - n and not day["over_limit"]
        assert 0 < short["reset_seconds"] <= 30
        assert abs(day["reset_seconds"] - to_midnight) <= 5, (day, to_midnight)
    status, second = admin(rls.http_url, "POST", "/counters", query)
    assert status == 200
    assert [[limit["used"] for limit in r["limits"]] for r in second["results"]] == [
        [limit["used"] for limit in r["limits"]] for r in first["results"]
    ], "querying charges nothing"

    too_many = rl_request("ads_frequency", [(("appid", "news"), ("key", f"k{i}"))
                                            for i in range(31)])
    status, body = admin(rls.http_url, "POST", "/counters", too_many)
    assert status == 400 and "30" in body["error"]

    out = subprocess.run(
        [sys.executable, "-m", "rls", "counters", "--admin", rls.http_url,
         "--domain", "ads_frequency", "-d", f"appid=news,key={keys[2]}"],
        capture_output=True, text=True, timeout=30, check=True,
    )
    (result,) = json.loads(out.stdout)["results"]
    assert {limit["used"] for limit in result["limits"]} == {counts[keys[2]]}


async def test_ads_natural_day_resets_at_shanghai_midnight(limiter_for):
    """§9.3: 10 per natural day in Asia/Shanghai (not per UTC day) and 3 per 30 seconds."""
    lim = limiter_for("ads-frequency")
    dom = "ads_frequency"
    key = (("appid", "news"), ("key", "u1:c1"))

    morning = shanghai_ms(2024, 3, 10, 7, 50, 0)  # 2024-03-09 23:50 UTC
    for i in range(10):  # one every 30 seconds: the 30-second limit never bites
        r = await decide(lim, dom, D(key), now_ms=morning + i * 30_000)
        assert r.overall == OK, i
    r = await decide(lim, dom, D(key), now_ms=shanghai_ms(2024, 3, 10, 7, 59, 50))
    assert r.overall == OVER_LIMIT
    assert r.statuses[0].limit.name == "per_natural_day"
    assert r.statuses[0].reset_seconds == 16 * 3600 + 10, "until 00:00 in Shanghai"
    # 08:00:30 in Shanghai is 00:00:30 UTC: a new UTC day, the same Shanghai day.
    r = await decide(lim, dom, D(key), now_ms=shanghai_ms(2024, 3, 10, 8, 0, 30))
    assert r.overall == OVER_LIMIT
    r = await decide(lim, dom, D(key), now_ms=shanghai_ms(2024, 3, 10, 23, 59, 59))
    assert r.overall == OVER_LIMIT
    r = await decide(lim, dom, D(key), now_ms=shanghai_ms(2024, 3, 11, 0, 0, 1))
    assert r.overall == OK, "the count resets at Shanghai midnight"

    ten = shanghai_ms(2024, 3, 11, 0, 10, 0)
    for i in range(3):
        assert (await decide(lim, dom, D(key), now_ms=ten + i * 1000)).overall == OK
    r = await decide(lim, dom, D(key), now_ms=ten + 3000)
    assert r.overall == OVER_LIMIT
    assert r.statuses[0].limit.name == "per_30_seconds"
    assert r.statuses[0].reset_seconds == 27
    assert (await decide(lim, dom, D(key), now_ms=ten + 30_000)).overall == OK
    assert await used(lim, dom, key, ten + 30_001) == {"per_30_seconds": 1, "per_natural_day": 5}


# --------------------------------------------------------------------------- 4. payments


async def test_payments_sliding_log_matches_the_exact_model(limiter_for, store_url):
    """§9.4: 5 clients over 3 s; each decision equals the exact rule "admit iff fewer than 100
    admitted in the last second" (window (t-1000 ms, t]), so no 1-second window, aligned or
    not, ever holds more than 100. Starts with the burst a fixed window would let through
    twice: 100 calls just before a second boundary and 100 just after."""
    lim = limiter_for("payments")
    provider = (("provider", "acme-pay"),)
    start = T_HOUR + 250
    rng = random.Random(20240917)
    arrivals = [start + 900 + i % 100 for i in range(100)]
    arrivals += [start + 1000 + i % 100 for i in range(100)]
    arrivals += [start + 1100 + rng.randrange(3000) for _client in range(5) for _ in range(120)]
    arrivals.sort()

    # Redis expires keys on the real clock, and this replay runs in injected time, which on a
    # loaded machine advances slower than the real one: the log's TTL (1 s window + 1 s grace
    # after its newest entry) could run out mid-story. PERSIST drops only that garbage-collection
    # TTL; the script trims the log by the entries' timestamps, which is what is tested here.
    keeper = redis.Redis.from_url(store_url) if store_url else None
    model: list[int] = []
    admitted: list[int] = []
    for t in arrivals:
        expected = sum(1 for a in model if a > t - 1000) < 100
        if expected:
            model.append(t)
        r = await decide(lim, "payments", D(provider), now_ms=t)
        if keeper is not None:
            for key in keeper.scan_iter(match="rl:payments*"):
                keeper.persist(key)
        assert (r.overall == OK) == expected, (t, len(admitted))
        if r.overall == OK:
            admitted.append(t)
    assert sum(1 for t in admitted if t < start + 1100) == 100, "the edge burst got 100, not 200"
    worst = max(sum(1 for a in admitted if t - 1000 < a <= t) for t in admitted)
    assert worst == 100
    assert len(admitted) >= 300
    if keeper is not None:
        keeper.close()


def test_payments_two_replicas_one_redis_never_exceed_100_per_second(rls_factory, redis_url):
    """§9.4 shared by a cluster: two `rls serve` replicas on one Redis, 5 concurrent clients
    alternating between them for 3 s.

    The client clock cannot see the server's decision instant, only that it lies between
    sending and receiving. So the check is sound: any admitted calls whose whole
    [sent, received] interval falls inside one 1-second span were decided inside it, and
    there must be at most 100 of them. Client and Redis share the host's real-time clock.
    """
    replicas = [rls_factory(scenario("payments"), args=serve_args(redis_url)) for _ in range(2)]
    results: list[tuple[float, float, bool, int]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    begin = time.time() + 0.2
    stop_at = begin + 3.0

    def client(n: int) -> None:
        clients = [RlsClient(r.grpc_addr) for r in replicas]
        mine: list[tuple[float, float, bool, int]] = []
        try:
            for c in clients:  # connect before the clock starts
                c.call("payments", descriptor((("provider", "warmup"),)))
            while time.time() < begin:
                time.sleep(0.001)
            i = n
            while time.time() < stop_at:
                replica = i % 2
                sent = time.time()
                resp = clients[replica].call(
                    "payments", descriptor((("provider", "acme-pay"),)))
                mine.append((sent, time.time(), resp.overall_code == GRPC_OK, replica))
                i += 1
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)
        finally:
            for c in clients:
                c.close()
            with lock:
                results.extend(mine)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(5)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert not errors, errors
    admitted = sorted((s, r) for s, r, ok, _ in results if ok)
    rejected = [x for x in results if not x[2]]
    assert rejected, "the clients did not push past the limit; the test proves nothing"
    assert len(admitted) >= 200, (len(admitted), len(results))
    assert {rep for _, _, ok, rep in results if ok} == {0, 1}, "both replicas admitted calls"
    worst = 0
    for a, _ in admitted:
        inside = sum(1 for s, r in admitted if s >= a and r < a + 1.0)
        worst = max(worst, inside)
    assert worst <= 100, f"{worst} admitted calls inside one second"
    # The domain has failure_mode: deny, so a call the store did not answer in time was
    # refused, never let through uncounted.
    span = admitted[-1][1] - admitted[0][0]
    assert len(admitted) <= 100 * (int(span) + 1)


async def test_usage_counts_the_first_call_after_a_script_flush_once(redis_server, redis_url):
    """DESIGN §6 / README: every call adds 1 to its daily `calls` statistic — also the first
    one after Redis lost its scripts (restart, failover, SCRIPT FLUSH)."""
    redis_server.client().script_flush()
    config = load_paths([str(scenario("open-platform"))])
    backend = RedisBackend(redis_url, timeout_ms=2000, connect_timeout_ms=2000)
    lim = RateLimiter(lambda: config, backend, Settings(backend_timeout_ms=2000), Metrics())
    try:
        now = T_HOUR + 1000
        for _ in range(2):
            await decide(lim, "open_platform", D((("app", "42"), ("ip", "10.0.0.1"))), now_ms=now)
        day = datetime.fromtimestamp(now / 1000, SHANGHAI).strftime("%Y%m%d")
        from rls.core.usage import calls_key

        key = calls_key(Settings().key_prefix, "open_platform", day, [("app", "42")])
        assert await backend.usage_value("c", key) == 2
    finally:
        await backend.close()
