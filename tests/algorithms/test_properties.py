"""Algorithm properties on both backends (MemoryBackend and RedisBackend, injected `now_ms`).

(a) sliding_log is exact: never more than N hits in any window of length W, and never a
    rejection while the window had room;
(b) overdraft over three windows (1000/hour, overdraft 300: 1200, then 800, then 1300);
(c) calendar windows across DST changes (23 and 25 hour days in America/New_York), through a
    full RateLimiter decision;
(d) a weighted cost above what remains is rejected and charges nothing, for every algorithm;
(e) 0-hit checks never change what later requests see, for every algorithm;
(f) token bucket / GCRA / leaky bucket allow exactly `burst` from idle, then refill at rpu per
    window;
plus release order (newest for sliding_log, oldest for concurrency), GCRA exact ties, calendar
overdraft debt across months of different lengths, and limit 0 for the buckets.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from fractions import Fraction
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from rls.config.loader import load_files
from rls.config.model import Limit, Unit
from rls.core.model import Check, Verdict
from rls.engine.calendar import calendar_window
from rls.engine.limiter import OK, OVER_LIMIT, DescriptorIn, RateLimiter
from rls.observability.metrics import Metrics
from rls.settings import Settings
from rls.stores.memory import MemoryBackend
from rls.stores.redis import RedisBackend

from .models import CHARGE_ALWAYS, NEGATIVE, QUOTA, SHADOW
from .support import (
    ALGORITHMS,
    ATTEMPTS,
    BASE_MS,
    BUCKETS,
    Guarded,
    WallClockStall,
    retry_on_stall,
)

HOUR_MS = 3_600_000
_SEQ = itertools.count()
_RUN = uuid.uuid4().hex[:8]

Backend = MemoryBackend | Guarded


def _key(tag: str) -> str:
    return f"prop:{_RUN}:{next(_SEQ)}:{tag}"


@pytest.fixture(params=["memory", "redis"])
async def backend(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[Backend]:
    if request.param == "memory":
        yield MemoryBackend(sweep_interval=0)
        return
    redis = RedisBackend(redis_url, timeout_ms=2000, connect_timeout_ms=2000)
    yield Guarded(redis)
    await redis.close()


async def one(
    backend: Backend, limit: Limit, key: str, hits: int, now: int, flags: int = 0
) -> Verdict:
    return await backend.decide([Check(0, limit, key, hits, flags)], now)


def _on_both_backends(
    redis_url: str,
    traces: st.SearchStrategy[Any],
    body: Callable[[Backend, Any], Awaitable[None]],
) -> None:
    """Hypothesis over `traces`, each example run on a fresh MemoryBackend and on Redis."""
    with asyncio.Runner() as runner:
        redis = Guarded(RedisBackend(redis_url, timeout_ms=2000, connect_timeout_ms=2000))

        @given(trace=traces)
        @HYPOTHESIS
        def run(trace: Any) -> None:
            runner.run(body(MemoryBackend(sweep_interval=0), trace))
            for _ in range(ATTEMPTS):  # body() takes fresh keys on every attempt
                redis.reset()
                try:
                    runner.run(body(redis, trace))
                    return
                except WallClockStall:
                    continue
            reject()  # the machine stalled for over a second in every attempt

        try:
            run()
        finally:
            runner.run(redis.close())


HYPOTHESIS = settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --- (a) sliding log: exact ------------------------------------------------------------------


@st.composite
def log_traces(draw: st.DrawFn) -> tuple[int, int, list[tuple[int, int]]]:
    limit = draw(st.integers(1, 6))
    window = 1000 * draw(st.integers(1, 3))
    now = BASE_MS + draw(st.integers(0, 5000))
    hits = []
    for _ in range(draw(st.integers(1, 40))):
        now += draw(st.one_of(st.just(0), st.integers(0, window // 4), st.integers(0, window)))
        hits.append((now, draw(st.integers(1, 3))))
    return limit, window, hits


def test_sliding_log_never_admits_more_than_n_in_any_window(redis_server) -> None:
    async def body(backend: Backend, trace: tuple[int, int, list[tuple[int, int]]]) -> None:
        limit_n, window, hits = trace
        limit = Limit(limit_n, Unit.SECOND, algorithm="sliding_log", unit_multiplier=window // 1000)
        key = _key("log")
        admitted: list[tuple[int, int]] = []
        for now, h in hits:
            verdict = await one(backend, limit, key, h, now)
            in_window = sum(c for t, c in admitted if t > now - window)
            # exact: admitted if and only if the last W ms (this instant included) have room
            assert verdict.admitted == (in_window + h <= limit_n), (backend.name, now, h)
            if verdict.admitted:
                admitted.append((now, h))
        for end, _ in admitted:  # every window (end - W, end] that ends on an admitted hit
            total = sum(c for t, c in admitted if end - window < t <= end)
            assert total <= limit_n, (backend.name, end, total)

    _on_both_backends(redis_server.url, log_traces(), body)


# --- (b) overdraft over three windows --------------------------------------------------------


@retry_on_stall
async def test_overdraft_borrows_then_repays_then_borrows_again(backend: Backend) -> None:
    limit = Limit(1000, Unit.HOUR, overdraft=300)
    key = _key("overdraft")

    async def admits(start: int, cost: int, tries: int) -> int:
        """How many of `tries` hits of weight `cost`, a second apart, are admitted."""
        return sum(
            [
                (await one(backend, limit, key, cost, start + i * 1000)).admitted
                for i in range(tries)
            ]
        )

    hour1, hour2, hour3, hour4 = (BASE_MS + i * HOUR_MS for i in range(4))
    # hour 1: 1200 used (within limit + overdraft 1300)
    assert await admits(hour1, 100, 12) == 12
    assert (await one(backend, limit, key, 0, hour1 + 60_000)).outcomes[0].remaining == 100
    # hour 2 owes 200: it starts at 200 used, allows 800 more and may not borrow
    probe = (await one(backend, limit, key, 0, hour2)).outcomes[0]
    assert (probe.used, probe.remaining) == (200, 800)
    over = await one(backend, limit, key, 801, hour2 + 1)
    assert not over.admitted and not over.outcomes[0].charged
    assert await admits(hour2 + 10, 100, 8) == 8
    assert await admits(hour2 + 60_000, 1, 5) == 0
    # hour 3 starts free of debt (hour 2 used exactly its limit): 1300 again
    assert await admits(hour3, 100, 13) == 13
    assert await admits(hour3 + 60_000, 1, 3) == 0
    # and hour 4 owes 300
    probe = (await one(backend, limit, key, 0, hour4)).outcomes[0]
    assert (probe.used, probe.remaining) == (300, 700)


# --- (c) calendar windows across DST ---------------------------------------------------------

NY = ZoneInfo("America/New_York")


def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def _local_midnight_ms(year: int, month: int, day: int) -> int:
    return int(datetime(year, month, day, tzinfo=NY).timestamp() * 1000)


@pytest.mark.parametrize(
    ("day", "hours"),
    [((2026, 3, 8), 23), ((2026, 3, 9), 24), ((2026, 11, 1), 25), ((2026, 11, 2), 24)],
)
def test_calendar_day_follows_local_midnights(day: tuple[int, int, int], hours: int) -> None:
    start = _local_midnight_ms(*day)
    for probe in (start, start + HOUR_MS, start + hours * HOUR_MS - 1):
        assert calendar_window(probe, Unit.DAY, 1, "America/New_York") == (
            start,
            start + hours * HOUR_MS,
        )
    assert calendar_window(start - 1, Unit.DAY, 1, "America/New_York")[1] == start


CALENDAR_YAML = """
domain: cal
descriptors:
  - key: ads
    rate_limit:
      unit: day
      requests_per_unit: 3
      calendar: true
      timezone: America/New_York
  - key: borrow_month
    rate_limit:
      unit: month
      requests_per_unit: 10
      overdraft: 5
      calendar: true
      timezone: UTC
"""


def _limiter(backend: Backend) -> RateLimiter:
    config = load_files([("calendar.yaml", CALENDAR_YAML)])
    # local_cache off: it remembers over-limit keys on the wall clock, not the injected one
    settings = Settings(local_cache=False, backend_timeout_ms=2000)
    return RateLimiter(lambda: config, backend, settings, Metrics())


@pytest.mark.parametrize(
    ("day", "hours"), [((2026, 3, 8), 23), ((2026, 11, 1), 25)], ids=["spring", "fall"]
)
@retry_on_stall
async def test_calendar_day_limit_resets_at_local_midnight_across_dst(
    backend: Backend, day: tuple[int, int, int], hours: int
) -> None:
    limiter = _limiter(backend)
    value = _key("ads")
    start = _local_midnight_ms(*day)
    end = start + hours * HOUR_MS

    async def call(now: int) -> tuple[int, int | None]:
        decision = await limiter.should_rate_limit(
            "cal", [DescriptorIn((("ads", value),))], now_ms=now
        )
        return decision.overall, decision.statuses[0].reset_ms

    for i in range(3):
        assert (await call(start + 1000 + i))[0] == OK
    assert await call(start + 2000) == (OVER_LIMIT, end - start - 2000)
    # the UTC day has already changed (00:xx UTC), the local day has not: still over
    utc_midnight = (end // (24 * HOUR_MS)) * (24 * HOUR_MS)
    assert start < utc_midnight < end
    assert (await call(utc_midnight + 1000))[0] == OVER_LIMIT
    assert await call(end - 1) == (OVER_LIMIT, 1)
    # local midnight after a 23 or 25 hour day: a fresh window
    for i in range(3):
        assert (await call(end + i))[0] == OK
    assert (await call(end + 10))[0] == OVER_LIMIT



async def test_calendar_debt_is_owed_for_the_whole_next_month_memory() -> None:
    limiter = _limiter(MemoryBackend(sweep_interval=0))
    desc = [DescriptorIn((("borrow_month", "a"),), hits=15)]
    early = await limiter.should_rate_limit("cal", desc, now_ms=_ms("2026-02-10T00:00Z"))
    assert early.overall == OK
    # March owes 5: only 5 of its 10 are left, on March 30 as on March 1
    desc = [DescriptorIn((("borrow_month", "a"),), hits=10)]
    late = await limiter.should_rate_limit("cal", desc, now_ms=_ms("2026-03-30T00:00Z"))
    assert late.overall == OVER_LIMIT


async def test_calendar_debt_is_owed_for_the_whole_next_month_redis(redis_url: str) -> None:
    redis = RedisBackend(redis_url, timeout_ms=2000, connect_timeout_ms=2000)
    try:
        limiter = _limiter(redis)
        now = _ms("2026-02-10T00:00Z")
        desc = [DescriptorIn((("borrow_month", "a"),), hits=15)]
        assert (await limiter.should_rate_limit("cal", desc, now_ms=now)).overall == OK
        # Redis expires on its own clock; the TTL the script set must cover all of March
        [key] = [k for k in await redis.client.keys("*") if b"borrow_month" in k]
        ttl = await redis.client.pttl(key)
        assert now + ttl >= _ms("2026-04-01T00:00Z")
    finally:
        await redis.close()


# --- (d) cost above what remains: rejected, nothing charged ---------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@retry_on_stall
async def test_cost_above_remaining_is_rejected_and_charges_nothing(
    backend: Backend, algorithm: str
) -> None:
    limit = Limit(10, Unit.MINUTE, algorithm=algorithm)  # GCRA interval 6000 ms: exact
    key, other = _key("d"), _key("other")
    now = BASE_MS + 5000
    assert (await one(backend, limit, key, 4, now)).admitted
    before = (await one(backend, limit, key, 0, now)).outcomes[0]
    assert before.remaining == 6

    # alone, and next to a check that has room (which must not be charged either)
    for checks in ([Check(0, limit, key, 7)], [Check(0, limit, other, 1), Check(1, limit, key, 7)]):
        verdict = await backend.decide(checks, now)
        assert not verdict.admitted
        *_, over = verdict.outcomes
        assert (over.ok, over.charged, over.remaining) == (False, False, 0)
        assert all(not o.charged for o in verdict.outcomes)
    fresh = (await one(backend, limit, other, 0, now)).outcomes[0]
    assert fresh.remaining == 10

    after = (await one(backend, limit, key, 0, now)).outcomes[0]
    assert after == before
    exact = await one(backend, limit, key, 6, now)
    assert exact.admitted and exact.outcomes[0].remaining == 0
    assert not (await one(backend, limit, key, 1, now)).admitted


@pytest.mark.parametrize("zero_flags", [SHADOW, CHARGE_ALWAYS, NEGATIVE])
async def test_a_zero_hit_check_does_not_move_a_fixed_windows_carried_debt(
    backend: Backend, zero_flags: int
) -> None:
    """Found by the property below: a 0-hit check that is charged (shadow, charge-always) or
    released wrote the window, moving the debt carried from the previous window into it, to be owed
    again by the next window (1/4 s with overdraft 1: refused at 8 s where a key without the
    0-hit check was admitted). A 0-hit charge writes nothing, on both stores."""
    limit = Limit(1, Unit.SECOND, algorithm="fixed_window", unit_multiplier=4, overdraft=1)
    plain, probed = _key("plain"), _key("probed")
    for key in (plain, probed):
        for flags in (0, 0, SHADOW):  # 1 + overdraft 1, and a shadow hit: 2 owed next window
            await one(backend, limit, key, 1, BASE_MS, flags)
    await one(backend, limit, probed, 0, BASE_MS + 4500, zero_flags)
    for key in (plain, probed):
        await one(backend, limit, key, 1, BASE_MS + 4500)  # refused: the debt is owed
    a = await one(backend, limit, plain, 1, BASE_MS + 8000)
    b = await one(backend, limit, probed, 1, BASE_MS + 8000)
    assert a.admitted and a == b


# --- (e) 0-hit checks never change state ----------------------------------------------------


@st.composite
def zero_hit_traces(draw: st.DrawFn, algorithm: str):
    # Rates and times on a 125 ms grid keep every bucket quantity a binary fraction, so floats
    # are exact and the two keys must agree bit for bit.
    rpu = draw(st.sampled_from([1, 2, 4, 8]) if algorithm in BUCKETS else st.integers(0, 8))
    multiplier = draw(st.sampled_from([1, 2, 4]))
    burst = draw(st.none() | st.integers(0, 8)) if algorithm in BUCKETS else None
    overdraft = draw(st.integers(0, rpu)) if algorithm == "fixed_window" else 0
    limit = Limit(
        rpu,
        Unit.SECOND,
        algorithm=algorithm,
        unit_multiplier=multiplier,
        burst=burst,
        overdraft=overdraft,
    )
    flags = st.sampled_from([0, 0, 0, SHADOW, QUOTA, CHARGE_ALWAYS, NEGATIVE])
    now = BASE_MS
    steps = []
    for _ in range(draw(st.integers(1, 20))):
        now += 125 * draw(st.one_of(st.just(0), st.integers(0, 8), st.integers(8, 80)))
        if draw(st.booleans()):
            steps.append((now, "zero", 0, draw(flags)))
        else:
            steps.append((now, "real", draw(st.integers(1, 4)), draw(flags)))
    return limit, steps


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_zero_hit_checks_never_change_state(algorithm: str, redis_server) -> None:
    async def body(backend: Backend, trace: tuple[Limit, list[tuple[int, str, int, int]]]) -> None:
        limit, steps = trace
        plain, probed = _key("plain"), _key("probed")
        for now, kind, hits, flags in steps:
            if kind == "zero":  # only the probed key sees the 0-hit checks
                await one(backend, limit, probed, 0, now, flags)
                continue
            a = await one(backend, limit, plain, hits, now, flags)
            b = await one(backend, limit, probed, hits, now, flags)
            assert a == b, (backend.name, now, hits, flags)

    _on_both_backends(redis_server.url, zero_hit_traces(algorithm), body)


# --- (f) buckets: burst from idle, then refill at rpu per window ----------------------------


@pytest.mark.parametrize("algorithm", BUCKETS)
@retry_on_stall
async def test_bucket_allows_exactly_burst_then_refills_at_rate(
    backend: Backend, algorithm: str
) -> None:
    limit = Limit(4, Unit.SECOND, algorithm=algorithm, burst=10)  # one hit per 250 ms
    key = _key("burst")
    t0 = BASE_MS + 777

    async def singles(now: int, tries: int) -> int:
        return sum([(await one(backend, limit, key, 1, now)).admitted for _ in range(tries)])

    assert await singles(t0, 12) == 10
    over = await one(backend, limit, key, 1, t0)
    assert over.outcomes[0].reset_ms == 250  # next token in one interval
    assert await singles(t0 + 249, 2) == 0
    assert await singles(t0 + 250, 2) == 1
    assert await singles(t0 + 1250, 6) == 4  # rpu per window
    assert await singles(t0 + 1250 + 3000, 15) == 10  # never more than burst
    # default burst is requests_per_unit
    plain = Limit(5, Unit.SECOND, algorithm=algorithm)
    t1 = t0 + 5000  # injected time only moves forward (see support.Guarded)
    assert sum([(await one(backend, plain, key + ":plain", 1, t1)).admitted for _ in range(7)]) == 5



@pytest.mark.parametrize(
    ("rpu", "multiplier", "burst"), [(3, 2, 1), (6, 1, 1), (7, 1, 1), (6, 1, 10), (3, 1, 5)]
)
@retry_on_stall
async def test_gcra_fresh_key_allows_its_whole_burst(
    backend: Backend, rpu: int, multiplier: int, burst: int
) -> None:
    limit = Limit(rpu, Unit.SECOND, algorithm="gcra", unit_multiplier=multiplier, burst=burst)
    verdict = await one(backend, limit, _key("gcra"), burst, BASE_MS)
    assert verdict.admitted


@pytest.mark.parametrize("algorithm", BUCKETS)
@retry_on_stall
async def test_bucket_with_limit_zero_admits_nothing_whatever_the_burst(
    backend: Backend, algorithm: str
) -> None:
    """requests_per_unit 0 blocks every request that adds a hit, as for the fixed window
    (buckets.py docstring); a burst does not open it."""
    limit = Limit(0, Unit.SECOND, algorithm=algorithm, burst=3)
    key = _key("zero")
    assert [(await one(backend, limit, key, 1, BASE_MS + i)).admitted for i in range(5)] == [
        False
    ] * 5


# --- release order --------------------------------------------------------------------------


@pytest.mark.parametrize(("algorithm", "left"), [("sliding_log", 0), ("concurrency", 1)])
@retry_on_stall
async def test_release_takes_newest_for_sliding_log_and_oldest_for_concurrency(
    backend: Backend, algorithm: str, left: int
) -> None:
    limit = Limit(3, Unit.SECOND, algorithm=algorithm)
    key = _key("release")
    t0 = BASE_MS
    assert (await one(backend, limit, key, 1, t0)).admitted
    assert (await one(backend, limit, key, 1, t0 + 500)).admitted
    release = await one(backend, limit, key, 1, t0 + 600, NEGATIVE)
    assert release.outcomes[0].charged and release.outcomes[0].remaining == 2
    # at t0 + 1100 the entry of t0 has aged out: what is left depends on which one was released
    probe = (await one(backend, limit, key, 0, t0 + 1100)).outcomes[0]
    assert probe.used == left
    # a lease whose release was lost expires after one unit
    assert (await one(backend, limit, key, 0, t0 + 1600)).outcomes[0].used == 0


def test_models_agree_with_documented_examples() -> None:
    """The reference models themselves, on the examples the docs give."""
    from .models import admission, make_model

    fw = make_model("fixed_window", 1000, HOUR_MS, overdraft=300)
    fw.charge(BASE_MS, 1200)
    assert fw.available(BASE_MS + HOUR_MS) == 800
    assert fw.available(BASE_MS + 2 * HOUR_MS) == 1300
    tb = make_model("token_bucket", 4, 1000, burst=10)
    tb.charge(BASE_MS, 10)
    assert tb.available(BASE_MS + 250) == 1
    assert make_model("gcra", 3, 2000, burst=1).available(BASE_MS) == Fraction(1)
    assert admission([0, QUOTA, QUOTA], [True, False, True]) == (True, [True, False, True])
    assert admission([0, QUOTA], [True, False]) == (False, [False, False])
    assert admission([SHADOW, CHARGE_ALWAYS, NEGATIVE], [False, False, False]) == (
        False,
        [False, True, True],
    )
