"""Exact logs: sliding log and concurrency (in-flight leases).

Both keep timestamped entries of (time, hits) and count those younger than the window:
- sliding_log: never more than the limit in any window of that length; a release takes back
  the newest hits.
- concurrency: entries are leases of in-flight requests; Envoy's stream-done call
  (is_negative_hits) releases the oldest; a lease whose release was lost expires after one unit.
`reset` is when enough entries will have aged out to let the next hit in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rls.core.algorithms.base import GRACE_MS, Evaluation

if TYPE_CHECKING:  # only for hints: the config parser imports this package
    from rls.core.model import Check

Entry = tuple[int, int, int]  # (time ms, sequence, hits)
Log = tuple[Entry, ...] | None


def _live(state: Log, now_ms: int, window: int) -> tuple[Entry, ...]:
    if not state:
        return ()
    return tuple(e for e in state if e[0] > now_ms - window)


class SlidingLog:
    release_oldest = False

    def evaluate(self, state: Log, now_ms: int, check: Check) -> Evaluation:
        window = check.limit.window_ms
        entries = _live(state, now_ms, window)
        used = sum(e[2] for e in entries)
        cap = check.limit.requests_per_unit
        hits = check.hits
        ok = used < cap if hits == 0 else used + hits <= cap
        if ok:
            reset = entries[0][0] + window - now_ms if entries else window
        else:
            reset = window
            freed = 0
            need = max(hits, 1)
            for ts, _, h in sorted(entries):
                freed += h
                if used - freed + need <= cap:
                    reset = ts + window - now_ms
                    break
        return ok, max(0, cap - used - hits), max(0, cap - used), reset, used

    def charge(self, state: Log, now_ms: int, check: Check) -> tuple[Log, int]:
        window = check.limit.window_ms
        entries = _live(state, now_ms, window)
        if check.hits > 0:
            seq = max((e[1] for e in entries), default=0) + 1
            entries = (*entries, (now_ms, seq, check.hits))
        expires = max((e[0] for e in entries), default=now_ms) + window + GRACE_MS
        return entries, expires

    def release(self, state: Log, now_ms: int, check: Check) -> tuple[Log, int]:
        window = check.limit.window_ms
        ordered = sorted(_live(state, now_ms, window))
        if not self.release_oldest:
            ordered.reverse()
        left = check.hits
        kept: list[Entry] = []
        for ts, seq, h in ordered:
            take = min(left, h)
            left -= take
            if h - take > 0:
                kept.append((ts, seq, h - take))
        kept.sort()
        expires = max((e[0] for e in kept), default=now_ms) + window + GRACE_MS
        return tuple(kept), expires


class Concurrency(SlidingLog):
    release_oldest = True
