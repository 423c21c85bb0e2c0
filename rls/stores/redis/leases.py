"""Leased counters (`--redis-leases`): a hot plain fixed-window counter decided in this process,
at memory speed, from tokens taken from its Redis counter beforehand.

Every token is charged in Redis before it is handed out (the reservation idea quota mode's
dealer uses), so the limit holds across any number of rls processes: a lease is a share of the
window's counter, taken by lua/lease.lua only while the counter has room, never past the limit.

- **Which keys.** Only plain fixed windows (epoch-aligned, no overdraft, not rolling, no
  calendar; `windows.counts_in_window`), whose counter is a plain integer in its window's own
  key, and only checks without flags (shadow, quota, charge-always, release and candidate
  checks go direct, as does a request carrying usage statistics). A key is leased once this
  process decided it HOT_CALLS times in one sweep period (cold keys go direct), and only when
  its limit is at least MIN_LIMIT (a lease's granularity would strand too much of a small one).
  A request is decided from leases only when every one of its checks has one; otherwise it
  goes to Redis per call as before (a per-call charge counts against the same counter, so the
  two mix freely).
- **All or nothing.** A request takes its hits from each of its checks' leases only when all
  of them have room; one check without room and without more to take from Redis refuses the
  request, which takes nothing.
- **Size.** A grant covers HORIZON_S of this process's demand on the key (its rate since the
  last grant), at most 1/MAX_SHARE of the limit and no more than the rest of the window would
  use: smaller near the window's end, so little is stranded there.
- **Refill.** Below LOW_WATER of its last grant, a lease is refilled in the background, off the
  reply path; a request that finds it empty waits for the refill (under its deadline).
- **Release.** Tokens not handed out are given back when the key goes idle (IDLE_S), on a
  config change, and on SIGTERM (the store's close). At the window's end they cannot be: the
  window is over, and they are counted as stranded.
- **Lost counters.** A give-back needs the record lua/lease.lua keeps beside the counter: after
  a Redis restart, flush, failover or expired key it is gone, the give-back does nothing, and
  the holder drops what it still held (`lost`) instead of dealing it on a fresh count.
- **What a lease answers.** `remaining` is the limit less the counter as of this process's
  last refill, plus what its lease still holds: tokens leased to other processes count as
  used. A key found full is refused locally for FULL_RETRY_S before Redis is asked again
  (another process may give tokens back).

Counts (decisions, refills, releases, tokens given back, tokens stranded, leases lost) are
buffered in a list the metrics flush (rls_lease_*_total, docs/metrics.md).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from rls.core.algorithms.base import GRACE_MS
from rls.core.model import Check, Outcome, Verdict
from rls.stores.deadline import Deadline, LoopLag

log = logging.getLogger("rls.backend")

LEASE_FILE = "lease.lua"  # in rls/lua/, shipped with the wheel
MIN_LIMIT = 100  # smaller limits go direct
HOT_CALLS = 8  # decisions of a window key in one sweep period before it is leased
HORIZON_S = 0.1  # a grant covers this long of this process's demand on the key
MAX_SHARE = 16  # a grant is at most 1/MAX_SHARE of the limit
LOW_WATER = 0.25  # refill in the background below this share of the last grant
IDLE_S = 1.0  # a lease unused this long gives its tokens back
FULL_RETRY_S = 0.1  # a key found full is refused locally this long before Redis is asked again
SWEEP_S = 0.25
MAX_LEASES = 10_000  # leases held at once (each ~400 B); beyond, new keys go direct
RELEASE_BUDGET_S = 1.0  # bound of a give-back call (background, drain)

# Indexes of the counts list (rls.observability.metrics.Metrics.lease_counts).
DECISIONS, REFILLS, RELEASES, RELEASED, STRANDED, LOST = range(6)
COUNT_NAMES = ("decisions", "refills", "releases", "released_tokens", "stranded_tokens", "lost")

# (checks, now_ms, deadline) -> the store's verdict: the Redis store's own decide or peek.
Direct = Callable[[Sequence[Check], int | None, Deadline | None], Awaitable[Verdict]]
# (script, keys, args, deadline) -> the script's reply, under the store's breaker.
ScriptCall = Callable[[Any, Sequence[Any], Sequence[Any], Deadline], Awaitable[Any]]


def hash_tag(key: str) -> str | None:
    """The hash tag Redis Cluster slots `key` by, or None when it has none."""
    start = key.find("{")
    if start < 0:
        return None
    end = key.find("}", start + 1)
    if end <= start + 1:
        return None
    return key[start + 1:end]


def record_key(counter: str) -> str | None:
    """The key of a counter's lease record, in the counter's hash slot; None when no such name
    can be built (a key with braces but no valid hash tag: such a key goes direct)."""
    if hash_tag(counter) is not None:
        return counter + "!lease"
    if "{" in counter or "}" in counter:
        return None
    return "{" + counter + "}!lease"


def holder_id() -> str:
    """This process among all rls processes on one Redis (host, pid, and a random part for a
    pid reused after a restart)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclass(slots=True, eq=False)
class Lease:
    """This process's share of one window's counter."""

    key: str  # the window's counter key
    record: str
    limit: int
    end_ms: int  # the window's end on the store's clock
    left: int = 0  # tokens taken and not handed out yet
    held: int = 0  # tokens taken and not given back (what the record should say)
    counter: int = 0  # the counter after this process's last call
    grant: int = 0  # the last grant
    served: int = 0  # hits handed out since the last grant
    granted_at: float = 0.0  # monotonic
    used_at: float = 0.0  # monotonic
    rate: float = 0.0  # hits per second of this process on this key
    full_until: float = 0.0  # monotonic: refused locally until then
    refill: asyncio.Future[None] | None = None


class Leases:
    """The leases of one store client (module docstring)."""

    def __init__(
        self,
        register_script: Callable[[str], Any],
        script_call: ScriptCall,
        now_ms: Callable[[], int],
        counts: list[float],
        timeout_s: float,
    ) -> None:
        text = (resources.files("rls") / "lua" / LEASE_FILE).read_text(encoding="utf-8")
        self._script = register_script(text)
        self._call = script_call
        self._now_ms = now_ms
        self.counts = counts
        self._timeout_s = timeout_s
        self.holder = holder_id()
        self.leases: dict[str, Lease] = {}
        self._seen: dict[str, int] = {}  # window key -> decisions this sweep period (cold keys)
        self._lag = LoopLag()  # not ticking: background calls are bounded on the wall clock
        self._sweeper: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()

    # -- deciding -----------------------------------------------------------------------------

    def decide_local(self, checks: Sequence[Check], now_ms: int | None) -> list[Outcome] | None:
        """The outcomes of a request decided from leases alone, or None when it must go to
        Redis (a check not leased, a lease without room for it)."""
        now = self._now_ms() if now_ms is None else now_ms
        leases = self.leases
        mono = time.monotonic()
        picked: list[tuple[Check, Lease]] = []
        refused = miss = False
        for check in checks:
            limit = check.limit
            if check.flags or check.bounds is not None or not limit.plain:
                miss = True  # goes to Redis per call
                continue
            key = f"{check.key}@{now // limit.window_ms}"
            lease = leases.get(key)
            if lease is None:
                seen = self._seen
                seen[key] = seen.get(key, 0) + 1  # leased once hot (Leases.decide)
                miss = True
                continue
            if lease.left < (check.hits or 1):
                if lease.full_until <= mono:
                    miss = True  # ask Redis for more
                    continue
                refused = True
            picked.append((check, lease))
        if miss:
            return None
        outcomes = []
        if refused:
            for check, lease in picked:
                need = check.hits or 1
                used = lease.counter - lease.left
                ok = lease.left >= need
                outcomes.append(Outcome(ok, False, lease.limit - used if ok else 0,
                                        lease.end_ms - now, used))
            return outcomes
        for check, lease in picked:
            hits = check.hits
            used = lease.counter - lease.left
            lease.left -= hits
            lease.served += hits
            lease.used_at = mono
            outcomes.append(Outcome(True, True, lease.limit - used - hits, lease.end_ms - now,
                                    used))
            if lease.refill is None and lease.left < lease.grant * LOW_WATER:
                self._spawn(self._begin(lease, 1, now, None))  # off the reply path
        self.counts[DECISIONS] += 1
        return outcomes

    async def decide(
        self, checks: Sequence[Check], now_ms: int | None, deadline: Deadline | None,
        direct: Direct, peek: Direct,
    ) -> Verdict | None:
        """Decide a request with leased checks among its checks: their hits come from their
        leases (taking from Redis what the leases lack, under `deadline`), the other checks'
        in one `direct` call (a `peek` when a lease already refused the request), all or
        nothing: a refusal by the direct call gives the leased hits back. None when no check
        is leased (the request goes direct as a whole)."""
        now = self._now_ms() if now_ms is None else now_ms
        for _ in range(3):  # others drained a refill meanwhile: ask again, a bounded number
            mono = time.monotonic()
            leased: list[tuple[int, Check, Lease]] = []
            rest: list[Check] = []
            short = []
            for i, check in enumerate(checks):
                lease = self._lease_of(check, now, mono)
                if lease is None:
                    rest.append(check)
                    continue
                leased.append((i, check, lease))
                need = check.hits or 1
                if lease.left < need and lease.full_until <= mono:
                    short.append((lease, need))
            if not leased:
                return None
            if short:
                await asyncio.gather(
                    *(self._refill(lease, need, deadline, now) for lease, need in short)
                )
                continue
            if any(lease.left < (check.hits or 1) for _, check, lease in leased):
                # A full lease refuses the request: nothing is taken anywhere.
                others = (await peek(rest, now_ms, deadline)).outcomes if rest else []
                return self._merged(checks, leased, others, now, taken=False)
            for _, check, lease in leased:
                lease.left -= check.hits
            try:
                verdict = await direct(rest, now_ms, deadline) if rest else None
            except BaseException:
                self._give(leased)
                raise
            if verdict is not None and not verdict.admitted:
                self._give(leased)
                return self._merged(checks, leased, verdict.outcomes, now, taken=False)
            for _, check, lease in leased:
                lease.served += check.hits
                lease.used_at = mono
            others = verdict.outcomes if verdict is not None else []
            return self._merged(checks, leased, others, now, taken=True)
        return None

    @staticmethod
    def _give(leased: Sequence[tuple[int, Check, Lease]]) -> None:
        """Put hits taken for a request that was refused back into their leases."""
        for _, check, lease in leased:
            lease.left += check.hits

    @staticmethod
    def _merged(
        checks: Sequence[Check], leased: Sequence[tuple[int, Check, Lease]],
        others: Sequence[Outcome], now: int, taken: bool,
    ) -> Verdict:
        """The request's outcomes in its checks' order: the leased checks' (their hits taken,
        or not) and the others' from the store."""
        outcomes: list[Outcome | None] = [None] * len(checks)
        for i, check, lease in leased:
            reset = lease.end_ms - now
            if taken:
                used = lease.counter - lease.left - check.hits
                outcomes[i] = Outcome(True, True, lease.limit - used - check.hits, reset, used)
            else:
                used = lease.counter - lease.left
                ok = lease.left >= (check.hits or 1)
                outcomes[i] = Outcome(ok, False, lease.limit - used if ok else 0, reset, used)
        rest = iter(others)
        merged = [o if o is not None else next(rest) for o in outcomes]
        return Verdict(all(o.ok for o in merged) and taken, merged)

    def _lease_of(self, check: Check, now: int, mono: float) -> Lease | None:
        """The lease of a check's window (made for a hot key), or None: the check goes to
        Redis per call."""
        limit = check.limit
        if check.flags or check.bounds is not None or not limit.plain:
            return None
        key = f"{check.key}@{now // limit.window_ms}"
        return self.leases.get(key) or self._lease(key, check, now, mono)

    def _lease(self, key: str, check: Check, now: int, mono: float) -> Lease | None:
        """A new lease of a hot key's window, or None (cold, small limit, too many leases, a
        key no record can sit beside)."""
        limit = check.limit
        seen = self._seen.get(key, 0)
        if (seen < HOT_CALLS or limit.requests_per_unit < MIN_LIMIT
                or len(self.leases) >= MAX_LEASES):
            return None
        record = record_key(key)
        if record is None:
            return None
        window = limit.window_ms
        # int(): the wire packs exact ints only (a limit from YAML is an int subclass).
        lease = Lease(key, record, int(limit.requests_per_unit), now - now % window + window,
                      granted_at=mono, used_at=mono)
        # The first rate: this period's decisions of the key, over the period so far.
        lease.rate = seen / SWEEP_S
        self.leases[key] = lease
        return lease

    # -- taking and giving back ---------------------------------------------------------------

    def _want(self, lease: Lease, need: int, now: int, mono: float) -> int:
        if lease.grant:
            rate = lease.served / max(mono - lease.granted_at, 1e-3)
            lease.rate = (lease.rate + rate) / 2
        left_s = max(lease.end_ms - now, 0) / 1000
        want = min(math.ceil(lease.rate * HORIZON_S), math.ceil(lease.rate * left_s))
        want = min(want, lease.limit // MAX_SHARE)
        return max(want, need - lease.left, 1)

    async def _refill(
        self, lease: Lease, need: int, deadline: Deadline | None, now: int
    ) -> None:
        """Take tokens for `lease` (at least `need` - what it holds, if the counter has them)
        at `now` (the store's clock), under `deadline`; one call at a time per lease: a caller
        arriving meanwhile waits for the one in flight."""
        while lease.refill is not None:
            await asyncio.shield(lease.refill)
            if lease.left >= need:
                return
        if now >= lease.end_ms:
            return  # the window is over: the request's next try picks the next one
        await self._begin(lease, need, now, deadline)

    def _begin(
        self, lease: Lease, need: int, now: int, deadline: Deadline | None
    ) -> Awaitable[None]:
        """Mark `lease` as refilling, at once (a request decided before the call starts must
        not begin another), and return the call. In the background (no `deadline`) a failure
        only leaves the lease as it was: the next request that finds it empty asks Redis."""
        mono = time.monotonic()
        want = self._want(lease, need, now, mono)
        lease.refill = asyncio.get_running_loop().create_future()
        return self._take(lease, want, need, now, mono, deadline or self._own())

    async def _take(
        self, lease: Lease, want: int, need: int, now: int, mono: float, deadline: Deadline
    ) -> None:
        try:
            reply = await self._call(
                self._script, [lease.key, lease.record],
                [self.holder, want, lease.limit, lease.end_ms - now + GRACE_MS, 0, lease.held],
                deadline,
            )
            self._took(lease, reply, need, mono)
        finally:
            self._settled(lease)
        if self.leases.get(lease.key) is not lease and lease.left:
            # Released (idle, config change) while this call was in flight: give it back too.
            self._spawn(self._give_back(lease))

    @staticmethod
    def _settled(lease: Lease) -> None:
        """The refill in flight is over (done, failed, or never started): wake its waiters."""
        refill, lease.refill = lease.refill, None
        if refill is not None and not refill.done():
            refill.set_result(None)

    def _took(self, lease: Lease, reply: Sequence[Any], need: int, mono: float) -> None:
        granted, counter, lost = int(reply[0]), int(reply[1]), int(reply[2])
        counts = self.counts
        counts[REFILLS] += 1
        if lost:
            counts[LOST] += 1
            lease.left = lease.held = 0
        lease.left += granted
        lease.held += granted
        lease.counter = counter
        lease.grant = granted
        lease.served = 0
        lease.granted_at = mono
        if lease.left < need:
            lease.full_until = mono + FULL_RETRY_S

    def _spawn(self, call: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(self._quietly(call))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    @staticmethod
    async def _quietly(call: Awaitable[Any]) -> None:
        try:
            await call
        except Exception as exc:  # the store's breaker has judged it; nothing waits on this
            log.debug("lease call failed: %s", exc)

    async def _give_back(self, lease: Lease) -> None:
        """Return what `lease` did not hand out to its counter (only while the counter still
        holds it: lua/lease.lua's record)."""
        back = lease.left
        if back <= 0:
            return
        now = self._now_ms()
        lease.left = 0
        reply = await self._call(
            self._script, [lease.key, lease.record],
            [self.holder, 0, lease.limit, max(lease.end_ms - now, 0) + GRACE_MS, back, lease.held],
            self._own(RELEASE_BUDGET_S),
        )
        given = int(reply[3])
        lease.held -= given
        self.counts[RELEASES] += 1
        self.counts[RELEASED] += given

    def _own(self, budget_s: float | None = None) -> Deadline:
        budget = self._timeout_s if budget_s is None else budget_s
        return Deadline(self._lag, budget, budget)

    # -- upkeep -------------------------------------------------------------------------------

    def sweep(self) -> None:
        """Forget cold keys' decision counts; count the leftovers of ended windows as stranded;
        give idle leases' tokens back."""
        self._seen.clear()
        now = self._now_ms()
        mono = time.monotonic()
        leases = self.leases
        for key, lease in list(leases.items()):
            if lease.refill is not None:
                continue
            if lease.end_ms <= now:
                self.counts[STRANDED] += lease.left
                del leases[key]
            elif mono - lease.used_at > IDLE_S:
                del leases[key]
                if lease.left:
                    self._spawn(self._give_back(lease))

    def release_all(self) -> list[Awaitable[None]]:
        """Give every lease's tokens back (config change, drain): the calls to await."""
        leases = list(self.leases.values())
        self.leases.clear()
        self._seen.clear()

        now = self._now_ms()
        calls: list[Awaitable[None]] = []
        for lease in leases:
            if lease.end_ms <= now:
                self.counts[STRANDED] += lease.left
            elif lease.left:
                calls.append(self._quietly(self._give_back(lease)))
        return calls

    def config_changed(self) -> None:
        """The limits may have changed: give every lease back (in the background)."""
        for call in self.release_all():
            self._spawn(call)

    def start(self) -> None:
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def close(self) -> None:
        """Stop sweeping and give everything back (SIGTERM's drain), each call bounded."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        await asyncio.gather(*list(self._background), return_exceptions=True)  # refills
        await asyncio.gather(*self.release_all(), *list(self._background),
                             return_exceptions=True)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            self.sweep()
