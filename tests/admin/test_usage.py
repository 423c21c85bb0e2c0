"""Usage statistics (README "Usage statistics", rls/core/usage.py): calls per day per app and
per app+interface, distinct users per app; GET /usage and `rls usage`."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from support.calls import OK, OVER, Grpc, cli, descriptor, http, query, uid
from support.served import SHARED_CONFIG

from rls.config.loader import load_paths
from rls.core.usage import calls_key, distinct_key
from rls.engine.limiter import OK as LIMITER_OK
from rls.engine.limiter import DescriptorIn, RateLimiter
from rls.observability.metrics import Metrics
from rls.settings import Settings
from rls.stores.memory import MemoryBackend
from rls.stores.redis import RedisBackend

TZ = "Pacific/Kiritimati"  # the domain's usage time zone (UTC+14)
FAR_TZ = "Etc/GMT+12"  # UTC-12: its date is never the date in Kiritimati


def day_in(tz: str) -> str:
    return datetime.now(ZoneInfo(tz)).strftime("%Y%m%d")


def usage(srv, **params: str) -> tuple[int, dict]:
    return http(srv.http_url, "GET", "/usage?" + urllib.parse.urlencode(params))


def calls(srv, **values: str) -> int:
    status, payload = usage(srv, domain="usage", **values)
    assert status == 200, payload
    return payload["calls"]


def test_calls_per_app_and_interface(srv):
    app, other = uid("app-"), uid("app-")
    day = day_in(TZ)
    with Grpc(srv.grpc_addr) as client:
        # Make sure the Redis script is loaded (its first load is tested on its own below).
        client.one("ops", ("k", uid()))
        for _ in range(3):
            assert client.one("usage", ("app", app), ("interface", "x")).overall_code == OK
        limited = [
            client.one("usage", ("app", app), ("interface", "limited")).overall_code
            for _ in range(5)
        ]
        assert limited == [OK, OK, OVER, OVER, OVER]
        for _ in range(2):  # matches no limit
            assert client.one("usage", ("app", app)).overall_code == OK
        # Two descriptors containing `app`: one call for the app.
        client.call(
            "usage", descriptor(("app", app), ("interface", "z")), descriptor(("app", app))
        )
        for user in ("u1", "u2", "u3", "u1"):
            client.one("usage", ("app", app), ("user", user))
        for _ in range(2):  # an app whose calls never match a limit
            client.one("usage", ("app", other))
    # A counter query is not a call.
    assert query(srv.http_url, "usage", [("app", app), ("interface", "x")])[0] == 200

    got = {
        "app": calls(srv, app=app),
        "app+x": calls(srv, app=app, interface="x"),
        "app+limited": calls(srv, app=app, interface="limited"),
        "app+z": calls(srv, app=app, interface="z"),
        "other app (no limit matched)": calls(srv, app=other),
    }
    assert got == {
        "app": 3 + 5 + 2 + 1 + 4,
        "app+x": 3,
        "app+limited": 5,  # admitted and rejected calls alike
        "app+z": 1,
        "other app (no limit matched)": 2,
    }, f"{srv.backend}: {got}"

    status, payload = usage(srv, domain="usage", distinct="user", app=app)
    assert status == 200 and payload["distinct"] == 3, payload
    # Days are the domain's time zone's days.
    if day == day_in(TZ):
        assert calls(srv, app=app, interface="x", day=day) == 3
        assert calls(srv, app=app, interface="x", day=day_in(FAR_TZ)) == 0


def test_usage_query_errors(srv):
    for params in (
        {"domain": "ops", "app": "a"},  # no usage_stats
        {"domain": "nope", "app": "a"},
        {"domain": "usage", "interface": "x"},  # no such key set
        {"domain": "usage", "app": "a", "distinct": "nope"},
    ):
        status, payload = usage(srv, **params)
        assert status == 404, (params, payload)
        assert "error" in payload


@pytest.mark.parametrize("srv", ["memory"], indirect=True)
@pytest.mark.parametrize("day", ["2026-99", "99999999", "20260230", "today", "2026112"])
def test_usage_day_that_is_no_date_is_400_naming_the_format(srv, day):
    """A malformed `day` used to answer 200 with calls 0, as if the day had no traffic."""
    for extra in ({}, {"distinct": "user"}):
        status, payload = usage(srv, domain="usage", app="a", day=day, **extra)
        assert status == 400, (day, payload)
        assert "YYYYMMDD" in payload["error"] and repr(day) in payload["error"]


@pytest.mark.parametrize("srv", ["memory"], indirect=True)
def test_usage_parameter_given_twice_is_400_naming_it(srv):
    """`app=42&app=43` used to answer for the last value silently."""
    status, payload = http(srv.http_url, "GET", "/usage?domain=usage&app=42&app=43")
    assert status == 400, payload
    assert "'app'" in payload["error"]


@pytest.mark.parametrize("srv", ["memory"], indirect=True)
def test_usage_cli(srv):
    app = uid("app-")
    with Grpc(srv.grpc_addr) as client:
        for user in ("a", "b", "a"):
            client.one("usage", ("app", app), ("interface", "x"))
            client.one("usage", ("app", app), ("user", user))
    out = cli("usage", "--admin", srv.http_url, "--domain", "usage", f"app={app}",
              "interface=x")
    assert out.returncode == 0, out.stdout + out.stderr
    printed = json.loads(out.stdout)
    assert printed["calls"] == 3 and printed["day"] == day_in(TZ), printed
    out = cli("usage", "--admin", srv.http_url, "--domain", "usage", "--distinct", "user",
              f"app={app}")
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["distinct"] == 2


def make_limiter(kind: str, request, tmp_path: Path) -> RateLimiter:
    path = tmp_path / "usage.yaml"
    path.write_text(SHARED_CONFIG["usage.yaml"])
    config = load_paths([str(path)])
    if kind == "redis":
        backend = RedisBackend(
            request.getfixturevalue("ops_redis").url, timeout_ms=2000, connect_timeout_ms=2000
        )
    else:
        backend = MemoryBackend()
    return RateLimiter(lambda: config, backend, Settings(backend_timeout_ms=2000), Metrics())


def app_calls(app: str, interface: str | None = None) -> tuple[str, str]:
    parts = [("app", app)] + ([("interface", interface)] if interface else [])
    return "c", calls_key("rl:", "usage", day_in(TZ), parts)


def stay_inside_one_day(tz: str, margin_s: float) -> None:
    """Sleep past the zone's next midnight when it is under `margin_s` away, so a test that
    counts per day never straddles two."""
    now = datetime.now(ZoneInfo(tz))
    left = 86400 - (now.hour * 3600 + now.minute * 60 + now.second + now.microsecond / 1e6)
    if left < margin_s:
        time.sleep(left + 0.5)


USERS = 10_000
PER_CALL = 20  # users per request: 500 requests
CONCURRENT = 25  # requests in flight at once


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_distinct_users_accuracy(kind, request, tmp_path: Path):
    """10,000 distinct users: exact on memory; Redis HyperLogLog within 2 % (3 sigma of its
    0.81 % standard error). Each request counts once for its app, whatever its descriptors."""
    limiter = make_limiter(kind, request, tmp_path)
    backend = limiter.backend
    app, run = uid("app-"), uid()
    stay_inside_one_day(TZ, margin_s=120)
    day = day_in(TZ)
    started = time.monotonic()
    try:
        # Warm-up (loads the Redis script), on another app.
        await limiter.should_rate_limit(
            "usage", [DescriptorIn((("app", "warm-up"), ("interface", "x")))]
        )
        codes = []
        requests = [
            [DescriptorIn((("app", app), ("user", f"{run}-{i}"))) for i in range(n, n + PER_CALL)]
            for n in range(0, USERS, PER_CALL)
        ]
        for first in range(0, len(requests), CONCURRENT):
            batch = requests[first : first + CONCURRENT]
            decisions = await asyncio.gather(
                *(limiter.should_rate_limit("usage", r) for r in batch)
            )
            codes += [d.overall for d in decisions]
        assert day == day_in(TZ), "the run left its day in the usage time zone"
        distinct = await backend.usage_value(
            "h", distinct_key("rl:", "usage", day, "user", [("app", app)])
        )
        counted = await backend.usage_value(*app_calls(app))
    finally:
        await backend.close()
    failed = limiter.metrics.registry.get_sample_value(
        "rls_backend_errors_total", {"backend": backend.name, "failure_mode": "allow"}
    )
    assert failed == 0, f"{failed} backend call(s) failed or timed out: nothing to measure"
    assert codes == [LIMITER_OK] * len(requests)
    assert counted == len(requests)
    if kind == "memory":
        assert distinct == USERS
    else:
        error = abs(distinct - USERS) / USERS
        assert error <= 0.02, f"HLL estimate {distinct} for {USERS} users: {error:.2%} off"
    print(f"{kind}: {USERS} users in {time.monotonic() - started:.1f} s, estimate {distinct}")


@pytest.mark.redis
async def test_usage_counted_once_when_redis_reloads_its_script(request, tmp_path: Path):
    """README "Operating it": redis-py reloads the script on NOSCRIPT by itself (Redis
    restarted, failed over or flushed its scripts). The usage increments pipelined with that
    EVALSHA must still count the call once."""
    limiter = make_limiter("redis", request, tmp_path)
    app = uid("app-")
    call = [DescriptorIn((("app", app), ("interface", "x")))]
    try:
        await limiter.should_rate_limit("usage", call)  # loads the script
        assert await limiter.backend.usage_value(*app_calls(app, "x")) == 1
        request.getfixturevalue("ops_redis").client().script_flush()
        decision = await limiter.should_rate_limit("usage", call)
        assert decision.overall == LIMITER_OK
        counted = await limiter.backend.usage_value(*app_calls(app, "x"))
    finally:
        await limiter.backend.close()
    assert counted == 2, f"2 calls, counted {counted} after a NOSCRIPT reload"
