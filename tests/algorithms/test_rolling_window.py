"""`window: rolling_from_first_hit` on fixed windows: the key's first charge opens its window.

- Differential replay (the traces of test_differential.py): MemoryBackend and RedisBackend
  (lua/fixed_window.lua through lua/decide.lua) agree on every Outcome field, and both agree
  with RollingWindowModel (tests/algorithms/models.py).
- Focused cases on both backends: the first hit at t opens [t, t + unit); t + unit - 1 ms still
  counts; t + unit starts afresh; reset is the key's own time left (the full window for a key
  without one); rejected requests, 0-hit checks and releases open no window.
- The paths around the store: the lean script is never used for them, the local over-limit
  cache keeps a key only until its own window end, the local fallback applies the same rule,
  the config parser and quota mode.
"""

from __future__ import annotations

import time
import uuid

import pytest

from rls.config.errors import ConfigError
from rls.config.loader import load_files
from rls.config.model import Limit, Unit
from rls.core.model import CHARGE_ALWAYS, NEGATIVE, Check
from rls.engine.fallback import FallbackLimiter
from rls.engine.limiter import OK, OVER_LIMIT, DescriptorIn, RateLimiter
from rls.observability.metrics import Metrics
from rls.quota.share import undealable
from rls.settings import Settings
from rls.stores.memory import MemoryBackend
from rls.stores.redis import RedisBackend

from .models import ModelStore, RollingWindowModel
from .support import BASE_MS, Guarded
from .test_differential import (
    KeySpec,
    Request,
    Trace,
    _checks,
    _run,
    _where,
    assert_matches_model,
    compare_backends,
)

MINUTE = 60_000
T = BASE_MS + 12_345  # not on any epoch boundary: aligned and rolling windows differ


def _rolling_limits(trace: Trace) -> list[Limit]:
    return [
        Limit(
            requests_per_unit=k.limit,
            unit=Unit.SECOND,
            unit_multiplier=k.multiplier,
            rolling=True,
        )
        for k in trace.keys
    ]


async def replay_backends(_: str, trace: Trace, redis: Guarded) -> None:
    await compare_backends(trace, f"roll:{uuid.uuid4().hex}:", _rolling_limits(trace), redis)


async def replay_model(_: str, trace: Trace, redis: Guarded) -> None:
    backend: MemoryBackend | Guarded
    for backend in (MemoryBackend(sweep_interval=0), redis):
        prefix, limits = f"roll:{uuid.uuid4().hex}:", _rolling_limits(trace)
        store = ModelStore(
            {
                f"{prefix}{i}": RollingWindowModel(k.limit, limits[i].window_ms)
                for i, k in enumerate(trace.keys)
            }
        )
        for step, req in enumerate(trace.requests):
            checks = _checks(trace, req, prefix, limits)
            got = await backend.decide(checks, req.now)
            admitted, expected = store.decide(req.now, [(c.key, c.hits, c.flags) for c in checks])
            assert all(e.reset is not None for e in expected)  # every reset is pinned here
            assert_matches_model(got, admitted, expected, f"{backend.name} {_where(step, req)}")


# The window's last millisecond and its end, exactly: random gaps rarely land on them.
EDGES = Trace(
    (KeySpec(limit=1, multiplier=1, burst=None, overdraft=0, flags=0),),
    tuple(
        Request(BASE_MS + 7 + t, ((0, 1, False),)) for t in (0, 999, 1_000, 1_999, 2_000)
    ),
)


def test_rolling_windows_agree_on_memory_and_redis(redis_server) -> None:
    _run("fixed_window", redis_server.url, replay_backends, (EDGES,))


def test_rolling_windows_agree_with_the_model(redis_server) -> None:
    _run("fixed_window", redis_server.url, replay_model, (EDGES,))


# --- focused cases, on both stores ----------------------------------------------------------


@pytest.fixture
def store(memory_or_redis):  # the shared memory/Redis store (tests/conftest.py)
    return memory_or_redis


def rolling(rpu: int = 3, unit: Unit = Unit.MINUTE) -> Limit:
    return Limit(requests_per_unit=rpu, unit=unit, rolling=True)


def check(limit: Limit, key: str, hits: int = 1, flags: int = 0, descriptor: int = 0) -> Check:
    return Check(descriptor, limit, key, hits, flags)


async def test_first_hit_opens_a_window_of_one_unit(store) -> None:
    lim = rolling()
    key = f"roll:{uuid.uuid4().hex}"
    first = await store.decide([check(lim, key)], T)
    assert first.admitted and first.outcomes[0].reset_ms == MINUTE  # not T's minute boundary
    late = await store.decide([check(lim, key, 2)], T + MINUTE - 1)
    assert late.admitted, "1 ms before the window's end the first hit still counts"
    assert (late.outcomes[0].used, late.outcomes[0].remaining, late.outcomes[0].reset_ms) == (
        1, 0, 1
    )
    full = await store.decide([check(lim, key)], T + MINUTE - 1)
    assert not full.admitted and full.outcomes[0].used == 3
    fresh = await store.decide([check(lim, key)], T + MINUTE)
    assert fresh.admitted, "the next charge after the end opens a new window"
    assert (fresh.outcomes[0].used, fresh.outcomes[0].reset_ms) == (0, MINUTE)


async def test_reset_is_the_time_left_in_the_keys_own_window(store) -> None:
    lim = rolling()
    key = f"roll:{uuid.uuid4().hex}"
    none_yet = await store.peek([check(lim, key, 0)], T)
    assert none_yet.outcomes[0].reset_ms == MINUTE, "no window yet: the full window"
    await store.decide([check(lim, key)], T + 5_000)
    later = await store.peek([check(lim, key, 0)], T + 50_000)
    assert later.outcomes[0].reset_ms == 15_000
    assert later.outcomes[0].used == 1


async def test_a_rejected_request_opens_no_window(store) -> None:
    lim, blocker = rolling(5), Limit(requests_per_unit=0, unit=Unit.HOUR)
    key, other = f"roll:{uuid.uuid4().hex}", f"block:{uuid.uuid4().hex}"
    rejected = await store.decide([check(lim, key), check(blocker, other, descriptor=1)], T)
    assert not rejected.admitted and not rejected.outcomes[0].charged
    too_big = await store.decide([check(lim, key, 6)], T + 1_000)  # more than the limit
    assert not too_big.admitted
    after = await store.decide([check(lim, key)], T + 30_000)
    assert after.outcomes[0].used == 0
    assert after.outcomes[0].reset_ms == MINUTE, "the window starts at the admitted hit"


async def test_zero_hits_and_releases_open_no_window(store) -> None:
    lim = rolling()
    key = f"roll:{uuid.uuid4().hex}"
    zero = await store.decide([check(lim, key, 0)], T)
    assert zero.admitted and zero.outcomes[0].charged  # charged 0 hits: no window
    release = await store.decide([check(lim, key, 2, NEGATIVE)], T + 1_000)
    assert release.outcomes[0].remaining == 3
    hit = await store.decide([check(lim, key)], T + 20_000)
    assert (hit.outcomes[0].used, hit.outcomes[0].reset_ms) == (0, MINUTE)
    # A release inside the window gives hits back and keeps the window's end.
    back = await store.decide([check(lim, key, 1, NEGATIVE)], T + 30_000)
    assert (back.outcomes[0].remaining, back.outcomes[0].reset_ms) == (3, 50_000)


async def test_charge_always_opens_the_window_even_when_rejected(store) -> None:
    lim = rolling(2)
    key = f"roll:{uuid.uuid4().hex}"
    over = await store.decide([check(lim, key, 5, CHARGE_ALWAYS)], T)
    assert not over.admitted and over.outcomes[0].charged
    later = await store.peek([check(lim, key, 0)], T + 10_000)
    assert (later.outcomes[0].used, later.outcomes[0].reset_ms) == (5, 50_000)


async def test_rolling_limits_never_take_the_lean_script(redis_url: str) -> None:
    backend = RedisBackend(redis_url)
    try:
        plain = Limit(requests_per_unit=3, unit=Unit.MINUTE)
        script, *_ = backend.scripts.args([check(plain, "a")], T, "d", backend.clock.now_ms)
        assert script is backend.scripts.lean
        script, *_ = backend.scripts.args(
            [check(plain, "a"), check(rolling(), "b")], T, "d", backend.clock.now_ms
        )
        assert script is not backend.scripts.lean
    finally:
        await backend.close()


# --- around the store -----------------------------------------------------------------------

CONFIG = """
domain: roll
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, window: rolling_from_first_hit}
  - key: aligned
    rate_limit: {unit: minute, requests_per_unit: 2}
"""


async def test_local_cache_keeps_a_key_only_until_its_own_window_end(redis_url: str) -> None:
    config = load_files([("roll.yaml", CONFIG)])
    backend = RedisBackend(redis_url, timeout_ms=2000, connect_timeout_ms=2000)
    await backend.start()
    try:
        limiter = RateLimiter(
            lambda: config, backend, Settings(backend_timeout_ms=2000), Metrics()
        )
        user = DescriptorIn((("user", uuid.uuid4().hex),))
        before = int(time.time() * 1000)
        codes = [(await limiter.should_rate_limit("roll", [user])).overall for _ in range(3)]
        after = int(time.time() * 1000)
        assert codes == [OK, OK, OVER_LIMIT]
        cache = limiter._over_cache
        assert cache is not None
        ((until, _),) = cache._known.values()
        # The first hit's window (Redis TIME, this machine's clock) ends one minute after it,
        # whatever the minute boundary.
        assert before + MINUTE - 50 <= until <= after + MINUTE + 50
        cached = await limiter.should_rate_limit("roll", [user])
        assert cached.overall == OVER_LIMIT
        assert 0 < cached.statuses[0].reset_ms <= until - before
    finally:
        await backend.close()


def test_fallback_applies_rolling_windows_with_its_share() -> None:
    config = load_files([("roll.yaml", CONFIG)])
    (lim,) = config.domains["roll"].root.by_key["user"][""].limits
    fallback = FallbackLimiter(0.5, Metrics())
    first = fallback.decide([check(lim, "k")], T)
    assert first[0].ok and first[0].reset_ms == MINUTE  # share 1 of 2, window from the hit
    assert not fallback.decide([check(lim, "k")], T + 59_999)[0].ok
    assert fallback.decide([check(lim, "k")], T + MINUTE)[0].ok


def test_rolling_and_aligned_limits_use_different_counters() -> None:
    config = load_files([("roll.yaml", CONFIG.replace("key: aligned", "key: user2"))])
    roll = config.domains["roll"].root.by_key["user"][""].limits[0]
    aligned = config.domains["roll"].root.by_key["user2"][""].limits[0]
    assert roll.rolling and not aligned.rolling
    assert roll.ident != aligned.ident  # switching a limit's window never reads old state


def test_both_windows_of_one_length_may_sit_on_one_node() -> None:
    text = """
domain: roll
descriptors:
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 2, window: rolling_from_first_hit}
      - {unit: minute, requests_per_unit: 5, window: aligned}
"""
    limits = load_files([("roll.yaml", text)]).domains["roll"].root.by_key["user"][""].limits
    assert [lim.full_key for lim in limits] == ["roll.user.1minute_rolling", "roll.user.1minute"]


@pytest.mark.parametrize(
    ("extra", "message", "line"),
    [
        ("window: rolling", "unknown window 'rolling' (one of aligned, rolling_from_first_hit)",
         6),
        ("window: rolling_from_first_hit, algorithm: token_bucket",
         "window rolling_from_first_hit applies to fixed_window only, not token_bucket", 6),
        ("window: rolling_from_first_hit, calendar: true",
         "window rolling_from_first_hit cannot be combined with calendar: true", 7),
        ("window: rolling_from_first_hit, overdraft: 1",
         "window rolling_from_first_hit cannot be combined with overdraft", 7),
    ],
)
def test_bad_window_settings_are_located_errors(extra: str, message: str, line: int) -> None:
    keys = [part.split(":")[0].strip() for part in extra.split(",")]
    body = "\n".join(f"      {part.strip()}" for part in extra.split(","))
    text = f"""domain: roll
descriptors:
  - key: user
    rate_limit:
      unit: minute
{body}
      requests_per_unit: 2
"""
    with pytest.raises(ConfigError) as err:
        load_files([("roll.yaml", text)])
    assert message in str(err.value)
    assert err.value.node == "roll.user.rate_limit"
    assert err.value.line == line, (keys, err.value.detail())


def test_quota_mode_does_not_deal_rolling_limits() -> None:
    why = undealable(rolling())
    assert why is not None and "rolling_from_first_hit" in why
    assert undealable(Limit(requests_per_unit=3, unit=Unit.MINUTE)) is None
    assert "token_bucket" in (undealable(Limit(3, Unit.MINUTE, algorithm="token_bucket")) or "")
