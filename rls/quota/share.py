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

Equal shares: the ledgers of one counter held by this process (one per stream and bucket)
register with the dealer (`join` / `leave`); what they may hold over the next horizon is split
so that each ends the window at the same total, used + grant (water-filling: a stream that
wants less leaves the rest to the others; see `Dealer._fair_cap`), so two streams with equal
demand get equal halves whichever reports first after a reset. Streams on other rls processes
are not known here: pacing alone spreads the window among them.

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
from dataclasses import dataclass, field

from rls.config.model import Limit
from rls.core.limits import WINDOW_ROLLING
from rls.core.model import CHARGE_ALWAYS, NEGATIVE, SHADOW, Check, Outcome, candidate_flags
from rls.engine.calendar import CalendarCache
from rls.engine.candidates import batch_verdict
from rls.stores.base import Backend, BackendError
from rls.stores.deadline import Deadline, LoopLag
from rls.stores.guard import decide_within

SUPPORTED_ALGORITHMS = frozenset({"fixed_window"})
REPORT_CADENCE_S = 5.0  # Envoy 1.40 reports every 5 s whatever reporting_interval says
# A grant covers this much of the bucket's recent demand: the 5 s until the next report plus
# slack for demand growing between reports.
HORIZON_S = 7.5
WINDOW_TOLERANCE_MS = 500  # a reported reset later than this past the known end = new window
GRANT_RETRIES = 3
IDLE_SHARE_DIVISOR = 4
MAX_TOKENS = 2**32 - 1  # TokenBucket.max_tokens is a uint32


@dataclass(slots=True)
class Ledger:
    """One limit of one bucket on one stream: what this stream holds in that limit's counter."""

    limit: Limit
    key: str
    stats_key: str | None = None
    reserved: int = 0  # charged to the counter, not yet reported as used
    end_ms: int = 0  # local-clock end of the window `reserved` was charged in (0: unknown)
    old_left: int = 0  # reservation left in the previous window at the last window push
    pushed_at_ms: int = 0  # when that push happened
    mine: int = 0  # net hits this ledger put into the counter's current window
    shared_until_ms: int = 0  # others used the counter recently (see `observe`)
    demand: int = 0  # tokens the bucket's last report projected over one horizon (0: unknown)

    @property
    def shared(self) -> bool:
        return self.shared_until_ms > 0

    def observe(self, used: int, now_ms: int) -> None:
        """Note whether the counter holds more than this ledger put in: others use it too.

        Remembered for two windows (at least 15 s), so right after a reset, when the new
        window is still empty, a counter known to be shared is still dealt as shared.
        """
        if used > self.mine:
            self.shared_until_ms = now_ms + max(2 * self.limit.window_ms, 15_000)
        elif now_ms >= self.shared_until_ms:
            self.shared_until_ms = 0

    @property
    def shadow(self) -> bool:
        return self.limit.shadow_mode


@dataclass(slots=True)
class Grant:
    """The outcome of a deal: `tokens` > 0 → token bucket, 0 → denied for `reset_ms`."""

    tokens: int
    reset_ms: int  # time until the tightest limit's window resets
    remaining: dict[str, int] = field(default_factory=dict)
    # The candidate limits' checks of the report and their outcomes (`Dealer.report`).
    candidates: Sequence[tuple[Check, Outcome]] = ()


def undealable(limit: Limit) -> str | None:
    """Why quota mode cannot deal `limit` (for the error log), or None when it can."""
    if limit.algorithm not in SUPPORTED_ALGORITHMS:
        return (
            f"algorithm {limit.algorithm}; supported: {', '.join(sorted(SUPPORTED_ALGORITHMS))}"
        )
    if limit.rolling:
        return f"window {WINDOW_ROLLING}: reservations would start its windows, not requests"
    return None


def paced(room: int, reset_ms: int) -> int:
    """The part of a shared counter's room one stream may take now: the room spread evenly
    over what is left of the window, one horizon's worth (all of it in the last horizon).

    So the first stream to report after a reset cannot take the whole window, admissions are
    spread over the window, and streams with demand above their pace get equal shares.
    """
    if room <= 0:
        return 0
    horizon_ms = HORIZON_S * 1000
    if reset_ms <= horizon_ms:
        return room
    return max(1, math.ceil(room * horizon_ms / reset_ms))


def demand_target(requests: int, elapsed_s: float) -> int:
    """Tokens covering `requests` seen over `elapsed_s`, projected over one horizon."""
    if elapsed_s <= 0:
        return max(1, requests)
    return max(1, math.ceil(requests / elapsed_s * HORIZON_S))


class Dealer:
    """Runs the settle/grant steps on a backend; owns no state besides calendar bounds."""

    def __init__(
        self,
        backend: Backend,
        timeout_ms: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        self.timeout = max(timeout_ms, 1) / 1000
        self.clock = clock
        self._calendar = CalendarCache()
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
        # The store's one guarded call; a LoopLag that does not tick: wall-clock time.
        deadline = Deadline(LoopLag(), self.timeout, self.timeout)
        try:
            verdict = await decide_within(self.backend, checks, deadline)
        except TimeoutError:
            self.backend.suspect()
            raise
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
        """Move every enforcing ledger to the grant G (or add G with `on_top`).

        A counter only this ledger uses gives its whole room (a lone client may burst as with
        ShouldRateLimit); a shared one is paced (see `paced`).
        """
        active = [i for i, ledger in enumerate(ledgers) if not ledger.shadow]
        if not active:
            return Grant(MAX_TOKENS, 0)
        base = {i: 0 if on_top else ledgers[i].reserved for i in active}
        pace = {
            i: paced(rooms[i], outcomes[i].reset_ms) if ledgers[i].shared else rooms[i]
            for i in active
        }
        # Equal shares among this process's streams on one counter (the pool is paced there,
        # so the room itself is not paced again).
        caps = [MAX_TOKENS]
        for i in active:
            cap = self._fair_cap(
                ledgers[i], base[i], rooms[i], outcomes[i].reset_ms, target, now
            )
            if cap is not None:
                caps.append(cap)
                pace[i] = rooms[i]
        if target is None:  # demand unknown: as much as the pace allows (on top of what is held)
            target = min(base[i] + pace[i] for i in active)
        for i in active:
            ledgers[i].demand = target
        # Never less than a quarter of the pace, whatever the last report's demand: a bucket
        # idle for a while and then busy must not be held to a token or two until its next
        # report when the limit has plenty of room (it costs nothing when room is scarce).
        floor = min(math.ceil(pace[i] / IDLE_SHARE_DIVISOR) for i in active)
        grant = min([max(target, floor), *caps] + [base[i] + pace[i] for i in active])
        grant = max(grant, 0)
        for _ in range(GRANT_RETRIES):
            checks: list[Check] = []
            which: list[int] = []
            for i in active:
                delta = grant - base[i] if not on_top else grant
                if delta:
                    flags = NEGATIVE if delta < 0 else 0
                    checks.append(self._check(ledgers[i], abs(delta), flags, now))
                    which.append(i)
            if not checks:
                break
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
                break
            # Another process took part of the room meanwhile: releases went through,
            # charges did not. Shrink the grant to what the charges could still get.
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
            grant = max(0, min(smaller, grant - 1))
        else:
            grant = 0
            if not on_top:  # give back everything still held past a failed race
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
        reset = max(
            (outcomes[i].reset_ms for i in active if base[i] + rooms[i] <= grant),
            default=min(outcomes[i].reset_ms for i in active),
        )
        remaining = {ledgers[i].key: outcomes[i].remaining for i in active}
        return Grant(grant, reset, remaining)

    def _fair_cap(
        self, ledger: Ledger, base: int, room: int, reset_ms: int, want: int | None, now: int
    ) -> int | None:
        """The most `ledger` may be granted when other streams of this process deal from the
        same counter (None when it is alone): equal window totals by water-filling.

        What the local streams may hold over the next horizon is the paced pool (the room plus
        their unused reservations, see `paced`). It is shared so that every stream ends at the
        same window total T (used so far + grant), a stream wanting less than that (its last
        report's demand) leaving the rest to the others.
        """
        peers = self._peers.get(ledger.key)
        if peers is None or len(peers) < 2 or id(ledger) not in peers:
            return None
        pool = room
        parts: list[tuple[int, int | None]] = []  # (used in this window, wanted or None)
        for peer in peers.values():
            if peer is ledger:
                parts.append((max(0, ledger.mine - base), want))
                pool += base
            elif peer.end_ms > now:
                pool += peer.reserved
                parts.append((max(0, peer.mine - peer.reserved), peer.demand or None))
            else:  # its window ended: it holds nothing of this one yet
                parts.append((0, peer.demand or None))
        share = paced(pool, reset_ms)

        def dealt(total: int) -> int:
            return sum(
                min(max(0, total - used), share if wanted is None else wanted)
                for used, wanted in parts
            )

        low, high = 0, max(used for used, _ in parts) + share
        while low < high:  # the smallest window total that deals the whole share
            mid = (low + high) // 2
            if dealt(mid) >= share:
                high = mid
            else:
                low = mid + 1
        return max(0, low - max(0, ledger.mine - base))
