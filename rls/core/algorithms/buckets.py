"""Token bucket, leaky bucket (as a meter) and GCRA.

All three allow `burst` (default requests_per_unit) at once and refill/drain at
requests_per_unit per window. `requests_per_unit: 0` admits nothing, whatever the burst (as for
every other algorithm: 0 blocks every request that adds a hit). `reset` is the time until the
next hit would be allowed when over, and the time until the bucket is full again when within.
Float arithmetic mirrors the Lua twins operation by operation.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rls.core.algorithms.base import GRACE_MS, Evaluation, burst_of

if TYPE_CHECKING:  # only for hints: the config parser imports this package
    from rls.core.model import Check

Bucket = tuple[float, int] | None  # (tokens or level, last update ms)



def _ms_at_rate(amount: float, check: Check) -> int:
    """How long the limit's rate takes to refill (or drain) `amount`: a whole window when the
    rate is 0."""
    cap = check.limit.requests_per_unit
    if cap <= 0:
        return check.limit.window_ms
    return math.ceil(amount * float(check.limit.window_ms) / float(cap))

class TokenBucket:
    def _tokens(self, state: Bucket, now_ms: int, check: Check) -> float:
        burst = burst_of(check)
        if state is None:
            return float(burst)
        tokens, last = state
        cap = check.limit.requests_per_unit
        if cap > 0 and now_ms > last:
            tokens = tokens + float(now_ms - last) * float(cap) / float(check.limit.window_ms)
        return min(float(burst), tokens)

    def evaluate(self, state: Bucket, now_ms: int, check: Check) -> Evaluation:
        if check.limit.requests_per_unit <= 0:
            return False, 0, 0, check.limit.window_ms, 0
        tokens = self._tokens(state, now_ms, check)
        hits = check.hits
        need = max(hits, 1)
        ok = tokens >= need
        burst = burst_of(check)
        if ok:
            reset = _ms_at_rate(float(burst) - (tokens - float(hits)), check)
        else:
            reset = _ms_at_rate(float(need) - tokens, check)
        remaining = max(0, math.floor(tokens - float(hits)))
        return ok, remaining, max(0, math.floor(tokens)), reset, max(0, burst - math.floor(tokens))

    def charge(self, state: Bucket, now_ms: int, check: Check) -> tuple[Bucket, int]:
        tokens = self._tokens(state, now_ms, check) - float(check.hits)
        full_in = _ms_at_rate(float(burst_of(check)) - tokens, check)
        return (tokens, now_ms), now_ms + full_in + GRACE_MS

    def release(self, state: Bucket, now_ms: int, check: Check) -> tuple[Bucket, int]:
        burst = float(burst_of(check))
        tokens = min(burst, self._tokens(state, now_ms, check) + float(check.hits))
        return (tokens, now_ms), now_ms + _ms_at_rate(burst - tokens, check) + GRACE_MS


class LeakyBucket:
    """Meter form: each hit pours into a bucket of size `burst` that leaks at the rate."""

    def _level(self, state: Bucket, now_ms: int, check: Check) -> float:
        if state is None:
            return 0.0
        level, last = state
        cap = check.limit.requests_per_unit
        if cap > 0 and now_ms > last:
            level = level - float(now_ms - last) * float(cap) / float(check.limit.window_ms)
        return max(0.0, level)

    def evaluate(self, state: Bucket, now_ms: int, check: Check) -> Evaluation:
        if check.limit.requests_per_unit <= 0:
            return False, 0, 0, check.limit.window_ms, 0
        level = self._level(state, now_ms, check)
        burst = float(burst_of(check))
        hits = check.hits
        need = max(hits, 1)
        ok = level + float(need) <= burst
        if ok:
            reset = _ms_at_rate(level + float(hits), check)
        else:
            reset = _ms_at_rate(level + float(need) - burst, check)
        return (
            ok,
            max(0, math.floor(burst - level - float(hits))),
            max(0, math.floor(burst - level)),
            reset,
            math.floor(level),
        )

    def charge(self, state: Bucket, now_ms: int, check: Check) -> tuple[Bucket, int]:
        level = self._level(state, now_ms, check) + float(check.hits)
        return (level, now_ms), now_ms + _ms_at_rate(level, check) + GRACE_MS

    def release(self, state: Bucket, now_ms: int, check: Check) -> tuple[Bucket, int]:
        level = max(0.0, self._level(state, now_ms, check) - float(check.hits))
        return (level, now_ms), now_ms + _ms_at_rate(level, check) + GRACE_MS


class Gcra:
    """Generic cell rate algorithm, with the theoretical arrival time kept exact.

    TAT = base + k x interval, interval = window / requests_per_unit. Storing (base ms, k hits)
    instead of TAT as a float keeps every comparison a single correctly-rounded division of
    exact integers, so ties (a hit exactly at its allowed time) are decided the same way on
    both backends and as exact arithmetic would: an absolute float TAT at today's epoch
    milliseconds has only ~2^-12 ms of precision and turns ties into refusals. Each whole window
    of elapsed time moves base forward and k back by requests_per_unit, keeping k small.
    """

    def _state(self, state: tuple[int, int] | None, now_ms: int, check: Check) -> tuple[int, int]:
        if state is None:
            return now_ms, 0
        base, k = state
        cap = check.limit.requests_per_unit
        window = check.limit.window_ms
        whole = min(k // cap, (now_ms - base) // window)
        if whole > 0:
            base, k = base + whole * window, k - whole * cap
        if float(k * window) / float(cap) < float(now_ms - base):
            return now_ms, 0  # TAT in the past: an idle bucket starts over at now
        return base, k

    def evaluate(self, state: tuple[int, int] | None, now_ms: int, check: Check) -> Evaluation:
        cap = check.limit.requests_per_unit
        burst = burst_of(check)
        hits = check.hits
        window = check.limit.window_ms
        if cap <= 0 or burst <= 0:
            return False, 0, 0, window, 0
        base, k = self._state(state, now_ms, check)
        elapsed = float(now_ms - base)
        need = max(hits, 1)
        over_by = k + need - burst  # hits past the horizon if taken now
        ok = over_by <= 0 or float(over_by * window) / float(cap) <= elapsed
        if ok:
            reset = math.ceil(float((k + hits) * window) / float(cap) - elapsed)
        else:
            reset = math.ceil(float(over_by * window) / float(cap) - elapsed)
        room = burst - k + math.floor(float((now_ms - base) * cap) / float(window))
        uncharged = min(burst, max(0, room))
        return ok, max(0, uncharged - hits), uncharged, max(0, reset), burst - uncharged

    def charge(
        self, state: tuple[int, int] | None, now_ms: int, check: Check
    ) -> tuple[tuple[int, int], int]:
        base, k = self._state(state, now_ms, check)
        k += check.hits
        return (base, k), base + self._span(k, check) + GRACE_MS

    def release(
        self, state: tuple[int, int] | None, now_ms: int, check: Check
    ) -> tuple[tuple[int, int], int]:
        if check.limit.requests_per_unit <= 0:
            return (now_ms, 0), now_ms + GRACE_MS
        base, k = self._state(state, now_ms, check)
        k = max(0, k - check.hits)
        return (base, k), base + self._span(k, check) + GRACE_MS

    def _span(self, k: int, check: Check) -> int:
        return math.ceil(
            float(k * check.limit.window_ms) / float(max(check.limit.requests_per_unit, 1))
        )
