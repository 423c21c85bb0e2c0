"""Fixed window counter with optional overdraft and calendar windows.

Windows are epoch-aligned like envoyproxy/ratelimit, or calendar windows whose bounds the
limiter computes (`check.bounds`). State is (window start, usage, debt at window start): the
window travels in the value, not the key, so keys are stable and a stale value reads as zero.
(Redis stores a plain window, no overdraft, calendar or rolling, as an integer in a key of its
own window instead, rls/stores/windows.py: the same decisions for fewer Redis instructions.)

Overdraft D: a window that starts free of debt may use up to limit + D; what it used beyond the
limit is owed by the next window, which then allows limit - debt and no borrowing
(1000/hour, D 300: 1200 in hour 1 leaves 800 for hour 2, hour 3 may borrow again).

Rolling windows (`limit.rolling`, YAML `window: rolling_from_first_hit`): the stored start is
the key's first charge; the window lasts `window_ms` from there, and the first charge after
its end starts the next one. A key without a live window reports the full window as its reset.
Only a charge of at least one hit starts a window: an uncharged check, a 0-hit charge or a
release leaves a key without a window as it is (no write). No overdraft (the parser refuses
it): with no fixed succession of windows there is no "next window" to owe debt to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rls.core.algorithms.base import GRACE_MS, Evaluation

if TYPE_CHECKING:  # only for hints: the config parser imports this package
    from rls.core.model import Check

State = tuple[int, int, int] | None  # (window start ms, usage incl. debt, debt at start)


def window_bounds(now_ms: int, check: Check) -> tuple[int, int, int]:
    if check.bounds is not None:
        return check.bounds
    window = check.limit.window_ms
    start = now_ms - now_ms % window
    return start, start + window, start - window


def rolling_live(state: State, now_ms: int, window_ms: int) -> bool:
    """Whether a rolling key's stored window still holds `now_ms` (lua/fixed_window.lua's twin
    test). A start later than now (an injected clock running behind) still counts as live."""
    return state is not None and now_ms < state[0] + window_ms


class FixedWindow:
    def _read(self, state: State, now_ms: int, check: Check) -> tuple[int, int, int, int]:
        if check.limit.rolling:
            window = check.limit.window_ms
            if state is not None and rolling_live(state, now_ms, window):
                return state[0], state[0] + window, state[1], 0
            return now_ms, now_ms + window, 0, 0
        start, end, prev = window_bounds(now_ms, check)
        usage = debt = 0
        if state is not None:
            if state[0] == start:
                usage, debt = state[1], state[2]
            elif state[0] == prev and check.limit.overdraft > 0:
                debt = max(0, state[1] - check.limit.requests_per_unit)
                usage = debt
        return start, end, usage, debt

    def evaluate(self, state: State, now_ms: int, check: Check) -> Evaluation:
        _, end, usage, debt = self._read(state, now_ms, check)
        limit = check.limit
        top = limit.requests_per_unit + (limit.overdraft if debt == 0 else 0)
        hits = check.hits
        ok = usage < top if hits == 0 else usage + hits <= top
        return ok, max(0, top - usage - hits), max(0, top - usage), end - now_ms, usage

    def _store(
        self, start: int, end: int, usage: int, debt: int, check: Check
    ) -> tuple[State, int]:
        # Debt must outlive the window by the whole next one, which may be longer (a calendar
        # month after February, a 25-hour day): twice this window covers every case.
        keep = 2 * (end - start) if check.limit.overdraft > 0 else 0
        return (start, usage, debt), end + keep + GRACE_MS

    def charge(self, state: State, now_ms: int, check: Check) -> tuple[State, int]:
        if self._no_window(state, now_ms, check, check.hits > 0):
            return None, 0  # nothing to keep: the store drops the key
        start, end, usage, debt = self._read(state, now_ms, check)
        return self._store(start, end, usage + check.hits, debt, check)

    def release(self, state: State, now_ms: int, check: Check) -> tuple[State, int]:
        if self._no_window(state, now_ms, check, False):
            return None, 0
        start, end, usage, debt = self._read(state, now_ms, check)
        return self._store(start, end, max(0, usage - check.hits), debt, check)

    @staticmethod
    def _no_window(state: State, now_ms: int, check: Check, starts: bool) -> bool:
        """A rolling key without a live window that this step does not start (see above)."""
        limit = check.limit
        return limit.rolling and not starts and not rolling_live(state, now_ms, limit.window_ms)
