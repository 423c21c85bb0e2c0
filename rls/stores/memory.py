"""Embedded in-memory counters: the default when no Redis is configured.

One process, one event loop: a request is decided without awaiting, so it is atomic. Expired
entries are dropped lazily on access and by a periodic sweep, so memory follows live keys.

Bounded in bytes (`--memory-max-bytes`): each counter is estimated at ENTRY_BYTES plus its
key's length (measured: ~300 B + key per counter in CPython 3.11, whatever the algorithm). The
dict's insertion order is the recency order: a charge pops and re-inserts its counter (the pop
also says whether the counter is new, for the byte count), and once the store holds TRACK_FROM
(half) of its bound a denied or uncharged check moves its counter to the end too (a counter
that keeps refusing a caller is in use); below that no eviction is near, and the order is
approximate only among counters unused since, all older than the rest. When a charge takes
the estimate over the bound, expired counters are dropped first, then the least recently
used, down to LOW_WATER of the bound, so the O(n) pass runs once per ~10 % of the bound, not
per request. An evicted counter is forgotten: its next request starts a fresh window, which
may admit up to one more limit in that window; the least recently used counter is the one
least likely to be asked for again before its window ends. Evictions are counted
(`on_evict`: the `rls_memory_evictions_total` metric).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from rls.core.admission import admit
from rls.core.algorithms import ALGORITHMS
from rls.core.algorithms.base import GRACE_MS
from rls.core.model import NEGATIVE, Check, Outcome, Verdict
from rls.core.usage import UsageOp
from rls.event_loop import cancel_and_wait
from rls.stores.deadline import Deadline

# Estimated bytes of one counter besides its key's characters: dict slot, key object, state
# tuple, expiry int (measured with 1M keys of fixed_window, sliding_window, token_bucket).
ENTRY_BYTES = 300
DEFAULT_MAX_BYTES = 64 << 20  # ~200,000 counters of 30-character keys (Helm: 256 Mi pods)
LOW_WATER = 0.9  # eviction frees down to this share of the bound
TRACK_FROM = 0.5  # recency is kept once the store holds this share of the bound


def least_recent(data: dict[str, Any], excess: float, cost: Callable[[str, Any], int]) -> list[str]:
    """Keys from the least recently used end of `data` (a dict kept in recency order) whose
    costs add up to at least `excess`."""
    victims = []
    for key, value in data.items():
        if excess <= 0:
            break
        victims.append(key)
        excess -= cost(key, value)
    return victims


class MemoryBackend:
    """The embedded store: decide_now answers at once in this process (StoreCalls calls it
    directly; `decide` is the same for callers of the Backend protocol)."""

    name = "memory"

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        sweep_interval: float = 5.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
        on_evict: Callable[[int], None] | None = None,
    ):
        self._clock = clock
        self._data: dict[str, tuple[Any, int]] = {}  # in recency order: last charged last
        self.max_bytes = max_bytes
        self._track_from = max_bytes * TRACK_FROM
        self.nbytes = 0  # estimated bytes of _data
        self.evictions = 0
        self._on_evict = on_evict
        self._sweep_interval = sweep_interval
        self._sweeper: asyncio.Task[None] | None = None
        self._usage: dict[str, tuple[Any, int]] = {}  # daily counters and exact sets

    def __len__(self) -> int:
        return len(self._data)

    async def start(self) -> None:
        if self._sweeper is None and self._sweep_interval > 0:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def close(self) -> None:
        await cancel_and_wait(self._sweeper)
        self._sweeper = None

    async def healthy(self) -> bool:
        return True

    def suspect(self) -> None:
        """In-process: nothing to probe."""

    async def check_health(self) -> bool:
        return True

    async def decide(
        self,
        checks: Sequence[Check],
        now_ms: int | None = None,
        usage: Sequence[UsageOp] = (),
        usage_ttl_ms: int = 0,
        deadline: Deadline | None = None,
    ) -> Verdict:
        if usage:
            self.record_usage_now(usage, usage_ttl_ms, now_ms)
        return self.decide_now(checks, now_ms)

    async def record_usage(
        self, ops: Sequence[UsageOp], ttl_ms: int, now_ms: int | None = None
    ) -> None:
        self.record_usage_now(ops, ttl_ms, now_ms)

    def record_usage_now(
        self, ops: Sequence[UsageOp], ttl_ms: int, now_ms: int | None = None
    ) -> None:
        now = int(self._clock() * 1000) if now_ms is None else now_ms
        data = self._usage
        for kind, key, member in ops:
            entry = data.get(key)
            if entry is None or entry[1] < now:
                value: Any = set() if kind == "h" else 0
            else:
                value = entry[0]
            if kind == "h":
                value.add(member)
            else:
                value += 1
            data[key] = (value, now + ttl_ms)

    async def usage_value(self, kind: str, key: str) -> int:
        now = int(self._clock() * 1000)
        entry = self._usage.get(key)
        if entry is None or entry[1] < now:
            return 0
        return len(entry[0]) if kind == "h" else int(entry[0])

    async def peek(self, checks: Sequence[Check], now_ms: int | None = None) -> Verdict:
        return self.decide_now(checks, now_ms, charge=False)

    def _evaluate(self, checks: Sequence[Check], now_ms: int) -> tuple[list[Any], bool, bool]:
        """Each check against its state: (rows of (check, state, algorithm, evaluation),
        whether any check carries flags, whether every check is within its limit)."""
        data = self._data
        rows = []
        flagged = False
        all_ok = True
        for check in checks:
            entry = data.get(check.key)
            # An expired entry reads as absent (the sweeper deletes it later).
            state = None if entry is None or entry[1] < now_ms else entry[0]
            algo = ALGORITHMS[check.limit.algorithm]
            ev = algo.evaluate(state, now_ms, check)
            rows.append((check, state, algo, ev))
            if check.flags:
                flagged = True
            if not ev[0]:
                all_ok = False
        return rows, flagged, all_ok

    def decide_now(
        self, checks: Sequence[Check], now_ms: int | None = None, charge: bool = True
    ) -> Verdict:
        if now_ms is None:
            now_ms = int(self._clock() * 1000)
        if charge:
            plain = self._decide_plain(checks, now_ms)
            if plain is not None:
                return plain
        data = self._data
        rows, flagged, all_ok = self._evaluate(checks, now_ms)
        if flagged:
            admitted, selected = admit([c.flags for c in checks], [r[3][0] for r in rows])
        else:  # no shadow, quota, release or charge-always: all or nothing
            admitted = all_ok
            selected = [all_ok] * len(rows)
        if not charge:
            selected = [False] * len(rows)
        outcomes = []
        added = 0
        for (check, state, algo, ev), do_charge in zip(rows, selected, strict=True):
            ok, rem_charged, rem_uncharged, reset, used = ev
            if do_charge and check.hits == 0 and check.limit.overdraft:
                # Writes nothing, charge or release (lua/fixed_window.lua likewise): written,
                # the debt carried from the previous window would move into this one, to be
                # owed again by the next.
                ok = ok or bool(check.flags & NEGATIVE)  # a release is always ok
                outcomes.append(Outcome(ok, True, rem_charged, reset, used))  # 0 hits: as is
                continue
            if do_charge:
                if check.flags & NEGATIVE:
                    new_state, expires = algo.release(state, now_ms, check)
                    rem_charged = _remaining_after_release(algo, new_state, now_ms, check)
                    ok = True
                else:
                    new_state, expires = algo.charge(state, now_ms, check)
                key = check.key  # popped, re-inserted: now the most recent (None: drop it)
                if data.pop(key, None) is not None:
                    if new_state is not None:
                        data[key] = (new_state, expires)
                    else:
                        added -= ENTRY_BYTES + len(key)
                elif new_state is not None:
                    data[key] = (new_state, expires)
                    added += ENTRY_BYTES + len(key)
                outcomes.append(Outcome(ok, True, rem_charged, reset, used))
            else:
                # A use too (a denied caller keeps asking): the most recent, near the bound.
                track = self.nbytes > self._track_from
                if track and (entry := data.pop(check.key, None)) is not None:
                    data[check.key] = entry
                outcomes.append(Outcome(ok, False, rem_uncharged if ok else 0, reset, used))
        if added:
            self.nbytes += added
            if self.nbytes > self.max_bytes:
                self.evict(now_ms)
        return Verdict(admitted, outcomes)

    def _decide_plain(self, checks: Sequence[Check], now_ms: int) -> Verdict | None:
        """decide_now for the commonest request: plain epoch-aligned fixed windows without
        flags, all or nothing. The same reads, writes and outcomes as the general path through
        FixedWindow (tests/algorithms pin the two and Redis to one model), in one loop without
        its per-check calls; None when any check is not such a window."""
        data = self._data
        reads = []
        all_ok = True
        for check in checks:
            limit = check.limit
            if check.flags or not limit.plain or check.bounds is not None:
                return None
            window = limit.window_ms
            start = now_ms - now_ms % window
            key = check.key
            used = 0
            entry = data.get(key)
            if entry is not None and entry[1] >= now_ms and entry[0][0] == start:
                used = entry[0][1]
            hits = check.hits
            cap = limit.requests_per_unit
            ok = used < cap if hits == 0 else used + hits <= cap
            if not ok:
                all_ok = False
            reads.append((key, start, start + window, used, hits, cap, ok))
        outcomes = []
        if all_ok:
            added = 0
            for key, start, end, used, hits, cap, _ in reads:
                after = used + hits
                if data.pop(key, None) is None:
                    added += ENTRY_BYTES + len(key)
                data[key] = ((start, after, 0), end + GRACE_MS)  # re-inserted: the most recent
                outcomes.append(
                    Outcome(True, True, cap - after if cap > after else 0, end - now_ms, used)
                )
            if added:
                self.nbytes += added
                if self.nbytes > self.max_bytes:
                    self.evict(now_ms)
            return Verdict(True, outcomes)
        track = self.nbytes > self._track_from
        for key, _, end, used, _, cap, ok in reads:
            # A use too (a denied caller keeps asking): the most recent, near the bound.
            if track and (entry := data.pop(key, None)) is not None:
                data[key] = entry
            outcomes.append(Outcome(ok, False, max(0, cap - used) if ok else 0, end - now_ms, used))
        return Verdict(False, outcomes)

    def evict(self, now_ms: int) -> int:
        """Back under the bound: expired counters first, then the least recently used,
        down to LOW_WATER of the bound; returns how many live counters were evicted."""
        target = self.max_bytes * LOW_WATER
        self.sweep(now_ms)
        if self.nbytes <= target:
            return 0
        data = self._data
        victims = least_recent(data, self.nbytes - target, lambda key, _: ENTRY_BYTES + len(key))
        for key in victims:
            del data[key]
            self.nbytes -= ENTRY_BYTES + len(key)
        self.evictions += len(victims)
        if self._on_evict is not None:
            self._on_evict(len(victims))
        return len(victims)

    def sweep(self, now_ms: int | None = None) -> int:
        if now_ms is None:
            now_ms = int(self._clock() * 1000)
        dead = [k for k, (_, exp) in self._data.items() if exp < now_ms]
        for k in dead:
            del self._data[k]
            self.nbytes -= ENTRY_BYTES + len(k)
        stale = [k for k, (_, exp) in self._usage.items() if exp < now_ms]
        for k in stale:
            del self._usage[k]
        return len(dead) + len(stale)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_interval)
            self.sweep()


def _remaining_after_release(algo: Any, state: Any, now_ms: int, check: Check) -> int:
    """What remains once hits were given back: an uncharged look at the new state."""
    return int(algo.evaluate(state, now_ms, replace(check, hits=0))[2])
