"""Fixed window + admission rule: an independent reference model against both backends.

The model below is written from DESIGN §6 and the rule stated in rls/core/admission.py's
docstring, not from rls's algorithm code:

- fixed windows aligned to the epoch: window index = now // window; a counter from an earlier
  window reads as 0; `reset_ms` = time to the end of the current window;
- a check has room when `used + hits <= limit`, and for 0 hits when `used < limit`
  ("is there room for at least one more?");
- releases (negative hits) take no part in admission and always apply (count floors at 0);
- a request is admitted when every enforcing (non-shadow, non-quota) check has room and, if
  there are quota checks, at least one of them has room (a shadow quota check counts as room);
- admitted: checks with room and shadow checks are charged; always: releases and
  `charge: always` checks; nothing else;
- Outcome: `ok` room (releases report True), `charged`, `remaining` = quota left after the
  request (0 when over; the uncharged remaining when not charged), `reset_ms`, `used` = usage
  before this request.

Within one request every check is on its own counter: the backend contract
(rls/stores/base.py) has the limiter fold checks sharing a counter before calling, so that
case is tested through the limiter (tests/engine/test_limiter.py).

Hypothesis traces are replayed against the model, MemoryBackend and RedisBackend with the same
injected clock; all three must agree decision by decision.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rls.config.model import Limit, Unit
from rls.core.model import CHARGE_ALWAYS, NEGATIVE, QUOTA, SHADOW, Check, Verdict
from rls.stores.memory import MemoryBackend
from rls.stores.redis import RedisBackend

WINDOWS = {1000: Unit.SECOND, 60000: Unit.MINUTE}
T0 = 1_700_000_040_000  # aligned to both the second and the minute
assert T0 % 60000 == 0


# -- the reference model --------------------------------------------------------------------


@dataclass(frozen=True)
class MCheck:
    key: str
    cap: int
    window_ms: int
    hits: int
    flags: int = 0


@dataclass
class Model:
    counters: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (window, count)

    def used(self, key: str, window_ms: int, now_ms: int) -> int:
        stored = self.counters.get(key)
        if stored is None or stored[0] != now_ms // window_ms:
            return 0
        return stored[1]

    def decide(self, checks: list[MCheck], now_ms: int) -> tuple[bool, list[tuple]]:
        used = [self.used(c.key, c.window_ms, now_ms) for c in checks]
        room = [
            (u < c.cap) if c.hits == 0 else (u + c.hits <= c.cap)
            for c, u in zip(checks, used, strict=True)
        ]
        admitted = True
        quota = [ok or bool(c.flags & SHADOW)
                 for c, ok in zip(checks, room, strict=True)
                 if c.flags & QUOTA and not c.flags & NEGATIVE]
        for c, ok in zip(checks, room, strict=True):
            if c.flags & (NEGATIVE | QUOTA | SHADOW):
                continue
            if not ok:
                admitted = False
        if quota and not any(quota):
            admitted = False

        outcomes = []
        for c, u, ok in zip(checks, used, room, strict=True):
            release = bool(c.flags & NEGATIVE)
            charged = (
                release
                or bool(c.flags & CHARGE_ALWAYS)
                or (admitted and (ok or bool(c.flags & SHADOW)))
            )
            reset = c.window_ms - now_ms % c.window_ms
            window = now_ms // c.window_ms
            if release:
                new = max(0, u - c.hits)
                self.counters[c.key] = (window, new)
                outcomes.append((True, True, max(0, c.cap - new), reset, u))
                continue
            if charged:
                self.counters[c.key] = (window, u + c.hits)
            if not ok:
                remaining = 0
            elif charged:
                remaining = c.cap - u - c.hits
            else:
                remaining = c.cap - u
            outcomes.append((ok, charged, remaining, reset, u))
        return admitted, outcomes


# -- helpers --------------------------------------------------------------------------------

_LIMITS: dict[tuple[int, int], Limit] = {}


def limit_for(cap: int, window_ms: int) -> Limit:
    lim = _LIMITS.get((cap, window_ms))
    if lim is None:
        lim = Limit(requests_per_unit=cap, unit=WINDOWS[window_ms], full_key=f"t.{cap}")
        _LIMITS[(cap, window_ms)] = lim
    return lim


def to_checks(checks: list[MCheck], ns: str) -> list[Check]:
    return [
        Check(i, limit_for(c.cap, c.window_ms), f"{ns}{c.key}", c.hits, c.flags)
        for i, c in enumerate(checks)
    ]


def flat(verdict: Verdict) -> tuple[bool, list[tuple]]:
    return verdict.admitted, [
        (o.ok, o.charged, o.remaining, o.reset_ms, o.used) for o in verdict.outcomes
    ]


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


@pytest.fixture(scope="module")
def redis_backend(redis_server, loop) -> Iterator[RedisBackend]:
    backend = RedisBackend(redis_server.url, timeout_ms=2000, connect_timeout_ms=2000)
    loop.run_until_complete(backend.start())
    yield backend
    loop.run_until_complete(backend.close())


class Runner:
    """Runs one MCheck request on a backend with a per-instance key namespace."""

    def __init__(self, backend, loop: asyncio.AbstractEventLoop) -> None:
        self.backend = backend
        self.loop = loop
        self.ns = f"fwtest:{uuid.uuid4().hex}:"

    def decide(self, checks: list[MCheck], now_ms: int) -> tuple[bool, list[tuple]]:
        verdict = self.loop.run_until_complete(
            self.backend.decide(to_checks(checks, self.ns), now_ms)
        )
        return flat(verdict)

    def used(self, key: str, cap: int, window_ms: int, now_ms: int) -> int:
        """Usage as seen by a 0-hit check (which charges nothing)."""
        _, [out] = self.decide([MCheck(key, cap, window_ms, 0)], now_ms)
        return out[4]


@pytest.fixture(params=["memory", "redis"])
def run(request, loop) -> Runner:
    if request.param == "memory":
        return Runner(MemoryBackend(sweep_interval=0), loop)
    return Runner(request.getfixturevalue("redis_backend"), loop)


# -- hypothesis traces ----------------------------------------------------------------------

key_specs = st.lists(
    st.tuples(st.integers(0, 6), st.sampled_from(sorted(WINDOWS))), min_size=1, max_size=4
)
flag_st = st.one_of(
    st.just(0),
    st.sampled_from([SHADOW, QUOTA, CHARGE_ALWAYS, NEGATIVE]),
    st.integers(0, 15),
)
delta_st = st.one_of(
    st.integers(0, 1500),
    st.sampled_from([0, 1, 999, 1000, 59_999, 60_000, 61_000, 120_000]),
)


@st.composite
def traces(draw: st.DrawFn) -> tuple[int, list[tuple[int, list[MCheck]]]]:
    specs = draw(key_specs)
    start = T0 + draw(st.integers(-120_000, 120_000))
    now = start
    steps = []
    for _ in range(draw(st.integers(1, 25))):
        now += draw(delta_st)
        idxs = draw(st.lists(st.integers(0, len(specs) - 1), min_size=1, max_size=4,
                             unique=True))
        checks = []
        for i in idxs:
            cap, window = specs[i]
            checks.append(MCheck(f"k{i}", cap, window, draw(st.integers(0, 5)), draw(flag_st)))
        steps.append((now, checks))
    return start, steps


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces())
def test_model_memory_redis_agree(trace, loop, redis_backend):
    _, steps = trace
    model = Model()
    memory = Runner(MemoryBackend(sweep_interval=0), loop)
    redis = Runner(redis_backend, loop)
    for n, (now, checks) in enumerate(steps):
        expected = model.decide(checks, now)
        got_memory = memory.decide(checks, now)
        got_redis = redis.decide(checks, now)
        where = f"step {n} at now={now} checks={checks}"
        assert got_memory == expected, f"memory differs from the model at {where}"
        assert got_redis == expected, f"redis differs from the model at {where}"


# -- model sanity (the model itself must encode DESIGN §6) ------------------------------------


def test_model_hits_zero_at_full_is_over():
    m = Model()
    assert m.decide([MCheck("a", 2, 60000, 2)], T0)[0]
    admitted, [out] = m.decide([MCheck("a", 2, 60000, 0)], T0)
    assert not admitted and out[:3] == (False, False, 0)


# -- explicit cases, run on both backends ---------------------------------------------------


def test_reset_ms_at_window_boundaries(run):
    _, [out] = run.decide([MCheck("w", 3, 60000, 1)], T0)
    assert out == (True, True, 2, 60000, 0)  # exactly at the boundary: a whole window left
    _, [out] = run.decide([MCheck("w", 3, 60000, 1)], T0 + 59_999)
    assert out == (True, True, 1, 1, 1)  # last millisecond of the window
    _, [out] = run.decide([MCheck("w", 3, 60000, 1)], T0 + 60_000)
    assert out == (True, True, 2, 60000, 0)  # next window: counter starts again
    _, [out] = run.decide([MCheck("s", 1, 1000, 1)], T0 + 1500)
    assert out == (True, True, 0, 500, 0)


def test_counter_resets_at_next_window(run):
    for _ in range(2):
        assert run.decide([MCheck("r", 2, 1000, 1)], T0 + 10)[0]
    admitted, [out] = run.decide([MCheck("r", 2, 1000, 1)], T0 + 999)
    assert not admitted and out == (False, False, 0, 1, 2)
    admitted, [out] = run.decide([MCheck("r", 2, 1000, 1)], T0 + 1000)
    assert admitted and out == (True, True, 1, 1000, 0)
    # Jumping several windows ahead also reads a fresh counter.
    admitted, [out] = run.decide([MCheck("r", 2, 1000, 2)], T0 + 5_250)
    assert admitted and out == (True, True, 0, 750, 0)


def test_hits_zero_exactly_full_is_not_ok(run):
    assert run.decide([MCheck("z", 3, 60000, 3)], T0)[0]
    admitted, [out] = run.decide([MCheck("z", 3, 60000, 0)], T0 + 5)
    assert not admitted
    assert out[0] is False and out[2] == 0 and out[4] == 3
    # One below full: a 0-hit check has room and charges nothing.
    _, [out] = run.decide([MCheck("z2", 3, 60000, 2)], T0)
    admitted, [out] = run.decide([MCheck("z2", 3, 60000, 0)], T0 + 5)
    assert admitted and out[0] is True and out[2] == 1
    assert run.used("z2", 3, 60000, T0 + 6) == 2


def test_limit_zero_blocks_everything(run):
    admitted, [out] = run.decide([MCheck("l0", 0, 60000, 1)], T0)
    assert not admitted and out[:3] == (False, False, 0)
    admitted, [out] = run.decide([MCheck("l0", 0, 60000, 0)], T0)
    assert not admitted and out[:3] == (False, False, 0)


def test_cost_larger_than_remaining_is_rejected_and_charges_nothing(run):
    admitted, [out] = run.decide([MCheck("c", 5, 60000, 3)], T0)
    assert admitted and out == (True, True, 2, 60000, 0)
    admitted, [out] = run.decide([MCheck("c", 5, 60000, 3)], T0 + 1)
    assert not admitted and out[:3] == (False, False, 0) and out[4] == 3
    assert run.used("c", 5, 60000, T0 + 2) == 3
    # The remaining 2 can still be used.
    admitted, [out] = run.decide([MCheck("c", 5, 60000, 2)], T0 + 3)
    assert admitted and out[2] == 0


def test_rejected_request_charges_no_other_limit(run):
    checks = [MCheck("a", 10, 60000, 1), MCheck("b", 0, 60000, 1), MCheck("c", 5, 1000, 2)]
    admitted, outs = run.decide(checks, T0)
    assert not admitted
    # Passing descriptors report their uncharged remaining.
    assert outs[0] == (True, False, 10, 60000, 0)
    assert outs[1][:3] == (False, False, 0)
    assert outs[2] == (True, False, 5, 1000, 0)
    assert run.used("a", 10, 60000, T0 + 1) == 0
    assert run.used("c", 5, 1000, T0 + 1) == 0


def test_shadow_check_does_not_block_and_records_usage(run):
    run.decide([MCheck("sh", 1, 60000, 1, SHADOW)], T0)
    admitted, outs = run.decide(
        [MCheck("sh", 1, 60000, 1, SHADOW), MCheck("o", 5, 60000, 1)], T0 + 1
    )
    assert admitted
    assert outs[0][:3] == (False, True, 0)
    assert outs[1] == (True, True, 4, 59_999, 0)


def test_quota_passes_if_any_quota_has_room(run):
    run.decide([MCheck("q1", 1, 60000, 1, QUOTA)], T0)
    admitted, outs = run.decide(
        [MCheck("q1", 1, 60000, 1, QUOTA), MCheck("q2", 3, 60000, 1, QUOTA)], T0 + 1
    )
    assert admitted
    assert outs[0][:2] == (False, False)  # only quotas with room are charged
    assert outs[1][:3] == (True, True, 2)
    run.decide([MCheck("q2", 3, 60000, 2, QUOTA)], T0 + 2)
    admitted, outs = run.decide(
        [MCheck("q1", 1, 60000, 1, QUOTA), MCheck("q2", 3, 60000, 1, QUOTA)], T0 + 3
    )
    assert not admitted and [o[1] for o in outs] == [False, False]


def test_charge_always_records_even_when_rejected(run):
    checks = [MCheck("ca", 2, 60000, 3, CHARGE_ALWAYS), MCheck("other", 5, 60000, 1)]
    admitted, outs = run.decide(checks, T0)
    assert not admitted
    assert outs[0][:3] == (False, True, 0)
    assert outs[1][:3] == (True, False, 5)
    assert run.used("ca", 2, 60000, T0 + 1) == 3
    assert run.used("other", 5, 60000, T0 + 1) == 0


def test_release_gives_hits_back(run):
    run.decide([MCheck("n", 5, 60000, 3)], T0)
    admitted, [out] = run.decide([MCheck("n", 5, 60000, 2, NEGATIVE)], T0 + 1)
    assert admitted
    # used is the usage before this request (3), remaining is after the release (5 - 1).
    assert out == (True, True, 4, 59_999, 3)
    assert run.used("n", 5, 60000, T0 + 2) == 1
    # A release never goes below zero.
    run.decide([MCheck("n", 5, 60000, 9, NEGATIVE)], T0 + 3)
    assert run.used("n", 5, 60000, T0 + 4) == 0


def test_release_applies_in_a_rejected_request(run):
    run.decide([MCheck("n2", 5, 60000, 4)], T0)
    admitted, outs = run.decide(
        [MCheck("n2", 5, 60000, 1, NEGATIVE), MCheck("blocked", 0, 60000, 1)], T0 + 1
    )
    assert not admitted
    assert outs[0][1] is True
    assert run.used("n2", 5, 60000, T0 + 2) == 3
