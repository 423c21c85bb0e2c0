"""Dealing shares through reservations on the ShouldRateLimit counters (memory, fake clock)."""

from __future__ import annotations

import asyncio

from support.stores import RemoteStore

from rls.config.model import Limit, Unit
from rls.core.model import Check
from rls.engine.checks import match_targets
from rls.quota.ledger import Ledger
from rls.quota.pacing import paced
from rls.quota.share import Dealer
from rls.stores.memory import MemoryBackend

T0 = 1_800_000.0  # seconds; a multiple of 60, so 5 s and minute windows start here


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def setup(rpu: int = 10, multiplier: int = 5) -> tuple[Clock, MemoryBackend, Limit]:
    """A limit per `multiplier` seconds (5 s: short enough that grants are not paced)."""
    clock = Clock()
    limit = Limit(requests_per_unit=rpu, unit=Unit.SECOND, unit_multiplier=multiplier,
                  full_key="d.k")
    return clock, MemoryBackend(clock=clock, sweep_interval=0), limit


def two_streams(clock: Clock, store: MemoryBackend,
                limit: Limit) -> tuple[Dealer, Ledger, Ledger]:
    """A dealer and two streams of one process, both joined, on `limit`'s counter "k"."""
    dealer = Dealer(store, 100, clock)
    a, b = Ledger(limit, "k"), Ledger(limit, "k")
    dealer.join(a)
    dealer.join(b)
    return dealer, a, b


def used(store: MemoryBackend, limit: Limit, key: str = "k") -> int:
    verdict = store.decide_now([Check(0, limit, key, 0)], charge=False)
    return verdict.outcomes[0].used


def run(coro):
    return asyncio.run(coro)


def test_grants_of_all_streams_never_exceed_what_is_left() -> None:
    clock, store, limit = setup(rpu=10)
    dealers = [Dealer(store, 100, clock) for _ in range(3)]
    ledgers = [[Ledger(limit, "k")] for _ in range(3)]
    grants = [
        run(d.report(led, allowed=0, target=6, last_report_ms=0)).tokens
        for d, led in zip(dealers, ledgers, strict=True)
    ]
    assert grants == [6, 4, 0]
    assert used(store, limit) == 10  # every token handed out is charged


def test_unused_tokens_are_given_back_at_the_next_report() -> None:
    clock, store, limit = setup(rpu=10)
    dealer = Dealer(store, 100, clock)
    ledger = [Ledger(limit, "k")]
    assert run(dealer.report(ledger, 0, 6, 0)).tokens == 6
    clock.now += 2
    grant = run(dealer.report(ledger, allowed=2, target=3, last_report_ms=0))
    assert grant.tokens == 3
    assert used(store, limit) == 2 + 3  # used so far + the new reservation


def test_usage_beyond_the_reservation_is_charged_whatever_the_room() -> None:
    clock, store, limit = setup(rpu=10)
    dealer = Dealer(store, 100, clock)
    ledger = [Ledger(limit, "k")]
    # First report of a new bucket: Envoy admitted 12 before any assignment existed.
    grant = run(dealer.report(ledger, allowed=12, target=5, last_report_ms=0))
    assert grant.tokens == 0
    assert grant.reset_ms == 5_000
    assert used(store, limit) == 12


def test_a_released_reservation_is_charged_when_the_next_stream_reports_its_use() -> None:
    clock, store, limit = setup(rpu=10)
    first = Dealer(store, 100, clock)
    old = [Ledger(limit, "k")]
    assert run(first.report(old, 0, 4, 0)).tokens == 4
    run(first.release(old))  # the stream ended (or rls drained): the 4 go back
    assert used(store, limit) == 0 and old[0].reserved == 0
    clock.now += 2
    # Envoy used 3 of the 4 tokens it still held and reports them on its next stream (to this
    # rls or another): they are charged then, so the window counts exactly what was admitted.
    second = Dealer(store, 100, clock)
    grant = run(second.report([Ledger(limit, "k")], allowed=3, target=3, last_report_ms=0))
    assert grant.tokens == 3
    assert used(store, limit) == 3 + 3


def test_window_push_deals_the_new_window_and_leaves_old_reservations_behind() -> None:
    clock, store, limit = setup(rpu=10)
    dealer = Dealer(store, 100, clock)
    ledger = [Ledger(limit, "k")]
    clock.now += 3
    assert run(dealer.report(ledger, 0, 8, 0)).tokens == 8
    clock.now = T0 + 5.05  # the next window
    assert run(dealer.push(ledger, target=8)).tokens == 8
    assert used(store, limit) == 8  # the new window holds only the new grant
    assert ledger[0].old_left == 8
    # Next report: 9 used since the report at T0+3; the push came 2.05 s into those 5 s.
    clock.now = T0 + 8
    run(dealer.report(ledger, allowed=9, target=1, last_report_ms=int((T0 + 3) * 1000)))
    # round(9 * 2.05/5) = 4 attributed to the old window's tokens, 5 to the new grant of 8;
    # the new grant shrinks to 1: 5 used + 1 reserved.
    assert used(store, limit) == 6


def test_push_takes_from_limits_still_in_their_window_on_top_of_their_reservation() -> None:
    clock = Clock()
    per_sec = Limit(requests_per_unit=5, unit=Unit.SECOND, full_key="d.s", index=1)
    per_min = Limit(requests_per_unit=100, unit=Unit.MINUTE, full_key="d.m", index=2)
    store = MemoryBackend(clock=clock, sweep_interval=0)
    dealer = Dealer(store, 100, clock)
    ledgers = [Ledger(per_sec, "s"), Ledger(per_min, "m")]
    assert run(dealer.report(ledgers, 0, 5, 0)).tokens == 5
    clock.now += 1.05
    assert run(dealer.push(ledgers, target=5)).tokens == 5
    assert used(store, per_sec, "s") == 5
    assert used(store, per_min, "m") == 10  # the old grant may have been used: still held


def test_lost_race_with_another_process_shrinks_the_grant() -> None:
    clock, _, limit = setup(rpu=10)

    class Racing(RemoteStore):
        calls = 0

        async def decide(self, checks, now_ms=None, usage=(), usage_ttl_ms=0, deadline=None):
            Racing.calls += 1
            if Racing.calls == 2:  # between settle and grant, someone else takes 7
                self.decide_now([Check(0, limit, "k", 7)])
            return await super().decide(checks, now_ms)

    racing = Racing(clock=clock, sweep_interval=0)
    grant = run(Dealer(racing, 100, clock).report([Ledger(limit, "k")], 0, 6, 0))
    assert grant.tokens == 3
    assert used(racing, limit) == 10


def test_grants_are_paced_over_the_rest_of_a_long_window() -> None:
    assert paced(100, 60_000) == 13  # 7.5 s of a 60 s window
    assert paced(100, 7_000) == 100  # the last horizon takes everything
    assert paced(0, 60_000) == 0
    clock, store, limit = setup(rpu=100, multiplier=60)
    store.decide_now([Check(0, limit, "k", 4)])  # another stream (or ShouldRateLimit) uses it
    grant = run(Dealer(store, 100, clock).report([Ledger(limit, "k")], 0, 80, 0))
    assert grant.tokens == 12  # ceil(96 * 7.5 / 60)


def test_a_counter_only_this_stream_uses_is_not_paced() -> None:
    clock, store, limit = setup(rpu=100, multiplier=60)
    dealer = Dealer(store, 100, clock)
    ledger = [Ledger(limit, "k")]
    # New bucket, demand unknown: the whole room, as ShouldRateLimit would admit a burst.
    assert run(dealer.report(ledger, 1, None, 0)).tokens == 99
    assert not ledger[0].shared
    clock.now += 2
    # Known demand: 7.5 s worth of it.
    assert run(dealer.report(ledger, 10, 40, 0)).tokens == 40
    assert used(store, limit) == 1 + 10 + 40


def test_bucket_key_is_the_should_rate_limit_key() -> None:
    from rls.config.loader import load_files

    dom = load_files([("x.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: "
                      "{unit: second, unit_multiplier: 5, requests_per_unit: 3}\n")]).domains["d"]
    ((limit, key, _, _),) = match_targets(dom, "d", (("k", "v"),), "rl:")
    clock = Clock()
    store = MemoryBackend(clock=clock, sweep_interval=0)
    assert run(Dealer(store, 100, clock).report([Ledger(limit, key)], 0, 9, 0)).tokens == 3
    assert used(store, limit, key) == 3


def test_idle_bucket_gets_a_quarter_of_the_pace_when_the_limit_has_room() -> None:
    clock, store, limit = setup(rpu=1000, multiplier=60)
    store.decide_now([Check(0, limit, "k", 40)])  # shared with another stream
    dealer = Dealer(store, 100, clock)
    # Demand seen in the last report was nil (target 1); the window has room for 960.
    grant = run(dealer.report([Ledger(limit, "k")], 0, 1, 0))
    assert grant.tokens == 30  # ceil(ceil(960 * 7.5 / 60) / 4)


def test_a_counter_seen_shared_is_still_paced_right_after_the_reset() -> None:
    clock, store, limit = setup(rpu=100, multiplier=60)
    store.decide_now([Check(0, limit, "k", 4)])  # another stream uses the counter
    dealer = Dealer(store, 100, clock)
    ledger = [Ledger(limit, "k")]
    run(dealer.report(ledger, 0, 1000, 0))
    clock.now = T0 + 60.05  # new window: empty so far
    assert run(dealer.push(ledger, target=1000)).tokens == 13  # ceil(100 * 7.5 / 59.95)


def test_calendar_and_overdraft_limits_are_dealt_from_their_own_windows() -> None:
    clock = Clock()
    store = MemoryBackend(clock=clock, sweep_interval=0)
    dealer = Dealer(store, 100, clock)
    day = Limit(requests_per_unit=50, unit=Unit.DAY, calendar=True, timezone="Asia/Shanghai",
                full_key="d.day")
    borrow = Limit(requests_per_unit=10, unit=Unit.SECOND, unit_multiplier=5, overdraft=5,
                   full_key="d.borrow")
    grant = run(dealer.report([Ledger(day, "day")], 0, None, 0))
    assert grant.tokens == 50
    # Reset at the next Shanghai midnight (UTC+8), not at the UTC day boundary.
    assert grant.reset_ms == 86_400_000 - (T0 * 1000 + 8 * 3_600_000) % 86_400_000
    assert run(dealer.report([Ledger(borrow, "b")], 0, None, 0)).tokens == 15


def test_streams_of_one_process_on_one_counter_get_equal_shares_whoever_asks_first() -> None:
    # 60 per 10 s, shared by two streams with the same demand: without equal shares the first
    # to be dealt after the reset took the pace of the whole window (45 of 60).
    clock, store, limit = setup(rpu=60, multiplier=10)
    dealer, a, b = two_streams(clock, store, limit)
    # b's demand is not known yet: the next 7.5 s may take 45 (the pace), a gets its half.
    assert run(dealer.report([a], 0, 100, 0)).tokens == 23
    # Every stream's demand is known now and exceeds the whole window: the rest is dealt at
    # once (rls.quota.pacing.dealable), to equal window totals of 30.
    assert run(dealer.report([b], 0, 100, 0)).tokens == 30
    # Both used what they held; a is topped up to 30, b holds its 30 already.
    clock.now += 5
    assert run(dealer.report([a], 23, 100, 0)).tokens == 7
    assert run(dealer.report([b], 30, 100, 0)).tokens == 0
    assert used(store, limit) == 60


def test_a_known_demand_above_the_window_is_paced_while_someone_else_uses_the_counter() -> None:
    clock, store, limit = setup(rpu=60, multiplier=60)
    dealer, a, b = two_streams(clock, store, limit)
    assert run(dealer.report([a], 0, 100, 0)).tokens == 4  # b's demand unknown: half the pace
    store.decide_now([Check(0, limit, "k", 1)])  # a ShouldRateLimit caller: demand unknown
    # Without that caller b would get 30 (all 60 dealt to equal totals); with it, half the
    # pace: ceil(59 * 7.5 / 60) = 8.
    assert run(dealer.report([b], 0, 100, 0)).tokens == 4


def test_a_share_another_stream_does_not_want_goes_to_the_one_that_does() -> None:
    clock, store, limit = setup(rpu=60, multiplier=10)
    dealer = Dealer(store, 100, clock)
    busy, idle = Ledger(limit, "k"), Ledger(limit, "k")
    dealer.join(busy)
    dealer.join(idle)
    # Wants 5 per 7.5 s; held to no less than a quarter of the room (the idle floor).
    assert run(dealer.report([idle], 0, 5, 0)).tokens == 15
    # Both demands known, together above the window: the busy one gets all the room left.
    assert run(dealer.report([busy], 0, 100, 0)).tokens == 60 - 15
    dealer.leave(idle)
    assert dealer.peers("k") == 1
