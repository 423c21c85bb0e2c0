"""Sliding window, the two-window weighted counter (Cloudflare style).

Usage = floor(previous window's count x the part of it still inside the sliding window) +
current window's count. Approximate (assumes the previous window's hits were spread evenly),
O(1) memory per key. State: (window start ms, current count, previous count).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rls.core.algorithms.base import GRACE_MS, Evaluation

if TYPE_CHECKING:  # only for hints: the config parser imports this package
    from rls.core.model import Check

State = tuple[int, int, int] | None


class SlidingWindow:
    def _read(self, state: State, now_ms: int, window: int) -> tuple[int, int, int]:
        start = now_ms - now_ms % window
        cur = prev = 0
        if state is not None:
            if state[0] == start:
                cur, prev = state[1], state[2]
            elif state[0] == start - window:
                prev = state[1]
        return start, cur, prev

    def evaluate(self, state: State, now_ms: int, check: Check) -> Evaluation:
        window = check.limit.window_ms
        start, cur, prev = self._read(state, now_ms, window)
        elapsed = now_ms - start
        used = math.floor(float(prev) * float(window - elapsed) / float(window)) + cur
        cap = check.limit.requests_per_unit
        hits = check.hits
        ok = used < cap if hits == 0 else used + hits <= cap
        if ok:
            reset = window - elapsed
        else:
            avail = cap - cur - max(hits, 1)
            if avail >= 0 and prev > 0:
                wait = math.ceil(float(window) - float(avail + 1) * float(window) / float(prev))
                reset = max(1, wait - elapsed)
            else:
                reset = window - elapsed
        return ok, max(0, cap - used - hits), max(0, cap - used), reset, used

    def charge(self, state: State, now_ms: int, check: Check) -> tuple[State, int]:
        window = check.limit.window_ms
        start, cur, prev = self._read(state, now_ms, window)
        return (start, cur + check.hits, prev), start + 2 * window + GRACE_MS

    def release(self, state: State, now_ms: int, check: Check) -> tuple[State, int]:
        window = check.limit.window_ms
        start, cur, prev = self._read(state, now_ms, window)
        return (start, max(0, cur - check.hits), prev), start + 2 * window + GRACE_MS
