"""Dealing shares of a global limit to RLQS streams through reservations on the same counters.

Envoy enforces a token bucket per bucket on its own and reports, every 5 s, how many requests
it admitted. To keep a limit exact across many Envoys and many rls replicas, every token handed
to Envoy is **charged to the limit's counter when it is granted** (a reservation), and at the
next report the part Envoy did not use is given back (`is_negative_hits`-style release). So the
tokens held by all streams never exceed what is left in the window, whichever rls process
dealt them: the counter is the single source of truth, exactly as for ShouldRateLimit.

Per report, two atomic store calls per bucket (one for a bucket that keeps its grant):
1. settle: charge what Envoy used beyond its reservation (`charge: always`; first requests
   admitted before any assignment, requests admitted in the milliseconds between a report and
   its answer) and read the room left;
2. grant: move each limit's reservation to the new grant G = min(target, reservation + room)
   with one all-or-nothing charge (or a release when the grant shrinks). A race with another
   process shrinks G and retries.

At a window reset the server pushes a fresh grant for the new window without waiting for a
report (otherwise a spent bucket would stay denied up to 5 s into the new window). Tokens left
from the old window stay charged to the old window; the next report attributes the usage it
carries to the old and new grant in proportion to time.

How much G may be (pacing, equal shares among this process's streams): rls.quota.pacing. The
ledgers of one counter held by this process register with the dealer (`join` / `leave`).

Stream ends: a reservation whose stream ended is released (`release`), and the usage a bucket
reports on its next stream is charged like any other (no `resumed` exception): the tokens
Envoy used from the released reservation are charged when it reports them, so a reconnection
never leaves tokens locked in the counter.

Candidate limits (`candidates:`) of the ledgers' limits ride in the settle call: each is
charged with the bucket's reported demand (allowed and denied) whatever its room, and the
grant carries their outcomes for the caller to report (rls.engine.candidates.batch_verdict).

Only fixed windows can be dealt this way (a reservation and its release must be exact inverses
and the room must not refill inside the window): see SUPPORTED_ALGORITHMS. Not rolling ones
(`window: rolling_from_first_hit`): a reservation is a charge, so the key's window would start
at the first grant and restart at every window push of an idle bucket, not at a request.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from rls.config.model import Limit
from rls.core.limits import RESERVABLE_ALGORITHMS, WINDOW_ROLLING
from rls.core.model import CHARGE_ALWAYS, NEGATIVE, SHADOW, Check, Outcome, candidate_flags
from rls.engine.calendar import CalendarCache
from rls.engine.candidates import batch_verdict
from rls.quota.ledger import Grant, Ledger
from rls.quota.pacing import IDLE_SHARE_DIVISOR, fair_cap, paced
from rls.stores.base import Backend, BackendError
from rls.stores.calls import StoreCalls
from rls.stores.deadline import LoopLag

SUPPORTED_ALGORITHMS = RESERVABLE_ALGORITHMS
WINDOW_TOLERANCE_MS = 500  # a reported reset later than this past the known end = new window
GRANT_RETRIES = 3
MAX_TOKENS = 2**32 - 1  # Envoy's TokenBucket max_tokens is a uint32


def undealable(limit: Limit) -> str | None:
    """Why quota mode cannot deal `limit` (for the error log), or None when it can."""
    if limit.algorithm not in SUPPORTED_ALGORITHMS:
        return (
            f"algorithm {limit.algorithm}; supported: {', '.join(sorted(SUPPORTED_ALGORITHMS))}"
        )
    if limit.rolling:
        return f"window {WINDOW_ROLLING}: reservations would start its windows, not requests"
    return None


class Dealer:
    """Runs the settle/grant steps on a backend; owns no state besides calendar bounds."""

    def __init__(
        self,
        backend: Backend,
        timeout_ms: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        self.clock = clock
        self._calendar = CalendarCache()
        # A LoopLag that never ticks: a quota store call's deadline is wall-clock time. One for
        # the dealer, not one per call (thousands of store calls wait at once under a report).
        self.store = StoreCalls(backend, LoopLag(), timeout_ms, timeout_ms)
        # This process's ledgers by counter key: a lone one in `_solo`, two or more in
        # `_peers` (a dict per counter only where it is shared: fewer objects for the
        # garbage collector to walk when a stream holds thousands of buckets).
        self._solo: dict[str, Ledger] = {}
        self._peers: dict[str, dict[int, Ledger]] = {}

    def join(self, ledger: Ledger) -> None:
        """`ledger` deals from its counter from now on (equal shares among the joined)."""
        key = ledger.key
        peers = self._peers.get(key)
        if peers is not None:
            peers[id(ledger)] = ledger
            return
        solo = self._solo.get(key)
        if solo is None or solo is ledger:
            self._solo[key] = ledger
            return
        del self._solo[key]
        self._peers[key] = {id(solo): solo, id(ledger): ledger}

    def leave(self, ledger: Ledger) -> None:
        key = ledger.key
        if self._solo.get(key) is ledger:
            del self._solo[key]
            return
        peers = self._peers.get(key)
        if peers is None:
            return
        peers.pop(id(ledger), None)
        if len(peers) <= 1:
            del self._peers[key]
            for last in peers.values():
                self._solo[key] = last

    def peers(self, key: str) -> int:
        """How many ledgers of this process deal from counter `key` (metrics, tests)."""
        return len(self._peers.get(key, ())) or (1 if key in self._solo else 0)

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _check(self, ledger: Ledger, hits: int, flags: int, now_ms: int) -> Check:
        limit = ledger.limit
        if limit.shadow_mode:
            flags |= SHADOW
        bounds = self._calendar.bounds(limit, now_ms) if limit.calendar else None
        return Check(0, limit, ledger.key, hits, flags, ledger.stats_key, bounds)

    def _candidate_checks(self, ledgers: Sequence[Ledger], demand: int, now_ms: int) -> list[Check]:
        """A check per candidate limit of `ledgers`, charged with the bucket's `demand` (the
        requests Envoy saw, allowed or denied) whatever the room: like ShouldRateLimit's
        candidates, each counter of its own, beside the live one (`<live key><ident>`)."""
        checks = []
        for i, ledger in enumerate(ledgers):
            for cand in ledger.limit.candidates:
                bounds = self._calendar.bounds(cand, now_ms) if cand.calendar else None
                flags = candidate_flags(CHARGE_ALWAYS, i)
                checks.append(Check(0, cand, ledger.key + cand.ident, demand, flags, None, bounds))
        return checks

    async def _settle_candidates(
        self, checks: list[Check], outcomes: list[Outcome]
    ) -> list[tuple[Check, Outcome]]:
        """Give back what each candidate was charged beyond its room, so its state holds the
        requests it would have admitted (a fixed window without overdraft needs none: once
        full it refuses everything until its window ends, whatever it holds beyond)."""
        releases = []
        for check, out in zip(checks, outcomes, strict=True):
            limit = check.limit
            if out.ok or (limit.algorithm == "fixed_window" and not limit.overdraft):
                continue
            over, _ = batch_verdict(check, out, 1.0)
            if over:
                releases.append(
                    Check(0, limit, check.key, over, check.flags | NEGATIVE, None, check.bounds)
                )
        if releases:
            try:
                await self._call(releases)
            except (BackendError, TimeoutError):
                pass  # a candidate a little over-charged; the live grant goes on
        return list(zip(checks, outcomes, strict=True))

    async def _call(self, checks: list[Check]) -> tuple[bool, list[Outcome]]:
        """One atomic step on the store (raises BackendError / TimeoutError)."""
        verdict = await self.store.verdict(checks)
        return verdict.admitted, verdict.outcomes

    async def report(
        self,
        ledgers: Sequence[Ledger],
        allowed: int,
        target: int | None,
        last_report_ms: int,
        demand: int = 0,
    ) -> Grant:
        """Settle `allowed` requests Envoy admitted since the last report; deal a new grant.

        Usage beyond the ledger's reservation is charged whatever the room (a new bucket's
        first requests, a bucket back on a new stream after its old stream's reservation was
        released). `target` None: demand unknown (a new bucket). `demand`: the requests Envoy
        saw (allowed and denied), charged to the ledgers' candidate limits in the same store
        call; the grant carries their outcomes (0: candidates are not counted).
        """
        now = self.now_ms()
        kept: list[int] = []
        checks: list[Check] = []
        for ledger in ledgers:
            used = allowed
            if ledger.shadow:
                kept.append(0)
                checks.append(self._check(ledger, used, CHARGE_ALWAYS, now))
                continue
            if ledger.old_left:
                span = max(now - last_report_ms, 1)
                before = min(max(ledger.pushed_at_ms - last_report_ms, 0), span)
                used -= min(ledger.old_left, round(allowed * before / span))
            held = ledger.reserved - used
            kept.append(max(0, held))
            forced = max(0, -held)
            checks.append(self._check(ledger, forced, CHARGE_ALWAYS if forced else 0, now))
        live = len(checks)
        cands = self._candidate_checks(ledgers, demand, now) if demand else []
        _, outcomes = await self._call(checks + cands if cands else checks)
        counted: Sequence[tuple[Check, Outcome]] = ()
        if cands:
            counted = await self._settle_candidates(cands, outcomes[live:])
            outcomes = outcomes[:live]
        for ledger, held, out, check in zip(ledgers, kept, outcomes, checks, strict=True):
            end = now + out.reset_ms
            if ledger.end_ms and end > ledger.end_ms + WINDOW_TOLERANCE_MS:
                held = 0  # the reservation was charged in a window that has ended
                ledger.mine = 0
            if held > out.used:  # the counter lost it (store restarted or flushed, evicted)
                held = out.used
                ledger.mine = min(ledger.mine, out.used)
            ledger.reserved, ledger.end_ms, ledger.old_left = held, end, 0
            ledger.observe(out.used, now)
            ledger.mine += check.hits
        rooms = [out.remaining for out in outcomes]
        grant = await self._grant(ledgers, outcomes, rooms, target, now, on_top=False)
        grant.candidates = counted
        return grant

    async def release(self, ledgers: Sequence[Ledger]) -> None:
        """Give back what `ledgers` still hold in windows not yet ended (their stream ended or
        Envoy stopped listing the bucket); one atomic store call."""
        now = self.now_ms()
        checks = [
            self._check(ledger, ledger.reserved, NEGATIVE, now)
            for ledger in ledgers
            if ledger.reserved > 0 and not ledger.shadow and ledger.end_ms > now
        ]
        for ledger in ledgers:
            ledger.mine = max(0, ledger.mine - ledger.reserved)
            ledger.reserved = 0
        if checks:
            await self._call(checks)

    async def push(self, ledgers: Sequence[Ledger], target: int | None) -> Grant:
        """A window of one of the bucket's limits reset: deal a grant for the new window.

        Reservations of limits whose window ended stay in the old window (`old_left`); limits
        still in their window keep theirs and get the new grant on top (Envoy's new token
        bucket replaces the old one, whose use is unknown until the next report).
        """
        now = self.now_ms()
        for ledger in ledgers:
            if ledger.shadow:
                continue
            if ledger.end_ms and now >= ledger.end_ms:
                ledger.old_left, ledger.pushed_at_ms = ledger.reserved, now
                ledger.reserved = ledger.mine = 0
        checks = [self._check(ledger, 0, 0, now) for ledger in ledgers]
        _, outcomes = await self._call(checks)
        for ledger, out in zip(ledgers, outcomes, strict=True):
            ledger.end_ms = now + out.reset_ms
            ledger.observe(out.used, now)
        rooms = [out.remaining for out in outcomes]
        return await self._grant(ledgers, outcomes, rooms, target, now, on_top=True)

    async def _grant(
        self,
        ledgers: Sequence[Ledger],
        outcomes: list[Outcome],
        rooms: list[int],
        target: int | None,
        now: int,
        on_top: bool,
    ) -> Grant:
        """Move every enforcing ledger to the grant G (or add G with `on_top`): size it, reserve
        it on the counters, say until when it holds.

        A counter only this ledger uses gives its whole room (a lone client may burst as with
        ShouldRateLimit); a shared one is paced (see `paced`).
        """
        active = [i for i, ledger in enumerate(ledgers) if not ledger.shadow]
        if not active:
            return Grant(MAX_TOKENS, 0)
        # What each ledger holds that counts toward G (its reservation; nothing with `on_top`).
        base = {i: 0 if on_top else ledgers[i].reserved for i in active}
        grant = self._size(ledgers, outcomes, rooms, base, active, target, now)
        grant, outcomes = await self._reserve(ledgers, outcomes, base, active, grant, now, on_top)
        reset = max(
            (outcomes[i].reset_ms for i in active if base[i] + rooms[i] <= grant),
            default=min(outcomes[i].reset_ms for i in active),
        )
        remaining = {ledgers[i].key: outcomes[i].remaining for i in active}
        return Grant(grant, reset, remaining)

    def _size(
        self,
        ledgers: Sequence[Ledger],
        outcomes: list[Outcome],
        rooms: list[int],
        base: dict[int, int],
        active: list[int],
        target: int | None,
        now: int,
    ) -> int:
        """G: the bucket's demand (`target`; None: unknown, as much as the pace allows), at
        least a quarter of the pace, at most what each counter may deal now (its room, paced
        when shared) and this process's equal share of it."""
        pace = {
            i: paced(rooms[i], outcomes[i].reset_ms) if ledgers[i].shared else rooms[i]
            for i in active
        }
        # Equal shares among this process's streams on one counter (the pool is paced there,
        # unless their demand is all known and above it, so the room is not paced again).
        caps = [MAX_TOKENS]
        for i in active:
            peers = self._peers.get(ledgers[i].key)
            out = outcomes[i]
            cap = fair_cap(
                peers, ledgers[i], base[i], rooms[i], out.reset_ms, target, now, out.used
            )
            if cap is not None:
                caps.append(cap)
                pace[i] = rooms[i]
        known = target is not None
        if target is None:  # demand unknown: as much as the pace allows (on top of what is held)
            target = min(base[i] + pace[i] for i in active)
        for i in active:
            ledgers[i].demand, ledgers[i].demand_known = target, known
        # Never less than a quarter of the pace, whatever the last report's demand: a bucket
        # idle for a while and then busy must not be held to a token or two until its next
        # report when the limit has plenty of room (it costs nothing when room is scarce).
        floor = min(math.ceil(pace[i] / IDLE_SHARE_DIVISOR) for i in active)
        return max(0, min([max(target, floor), *caps] + [base[i] + pace[i] for i in active]))

    async def _reserve(
        self,
        ledgers: Sequence[Ledger],
        outcomes: list[Outcome],
        base: dict[int, int],
        active: list[int],
        grant: int,
        now: int,
        on_top: bool,
    ) -> tuple[int, list[Outcome]]:
        """Charge (or release) each ledger's way to `grant` in one all-or-nothing store call;
        when another process took part of the room meanwhile, shrink the grant to what is left
        and try again. The grant reserved and the outcomes of the moves (0 after
        GRANT_RETRIES lost races: then, unless `on_top`, everything held is given back)."""
        for _ in range(GRANT_RETRIES):
            which: list[int] = []
            checks: list[Check] = []
            for i in active:
                delta = grant - base[i] if not on_top else grant
                if delta:
                    flags = NEGATIVE if delta < 0 else 0
                    checks.append(self._check(ledgers[i], abs(delta), flags, now))
                    which.append(i)
            if not checks:
                return grant, outcomes
            admitted, outs = await self._call(checks)
            if admitted:
                for i, check in zip(which, checks, strict=True):
                    signed = -check.hits if check.flags & NEGATIVE else check.hits
                    ledgers[i].mine = max(0, ledgers[i].mine + signed)
                for i in active:
                    ledgers[i].reserved = ledgers[i].reserved + grant if on_top else grant
                outcomes = list(outcomes)
                for i, out in zip(which, outs, strict=True):
                    outcomes[i] = out
                return grant, outcomes
            grant = await self._shrink(ledgers, base, which, checks, grant, now)
        if not on_top:
            await self._give_back_held(ledgers, active, now)
        return 0, outcomes

    async def _shrink(
        self,
        ledgers: Sequence[Ledger],
        base: dict[int, int],
        which: list[int],
        checks: list[Check],
        grant: int,
        now: int,
    ) -> int:
        """A lost race: the releases went through, the charges did not. The grant the charges
        could still get (smaller than `grant`)."""
        short: list[int] = []
        for i, check in zip(which, checks, strict=True):
            if check.flags & NEGATIVE:
                ledgers[i].mine = max(0, ledgers[i].mine - check.hits)
                ledgers[i].reserved = grant
                base[i] = grant
            else:
                short.append(i)
        _, peeks = await self._call([self._check(ledgers[i], 0, 0, now) for i in short])
        smaller = min(base[i] + out.remaining for i, out in zip(short, peeks, strict=True))
        return max(0, min(smaller, grant - 1))

    async def _give_back_held(self, ledgers: Sequence[Ledger], active: list[int], now: int) -> None:
        """Give back everything still held past a failed race."""
        releases = [
            self._check(ledgers[i], ledgers[i].reserved, NEGATIVE, now)
            for i in active
            if ledgers[i].reserved
        ]
        if releases:
            await self._call(releases)
        for i in active:
            ledgers[i].mine = max(0, ledgers[i].mine - ledgers[i].reserved)
            ledgers[i].reserved = 0
