"""Token bucket, leaky bucket (as a meter) and GCRA.

All three allow `burst` (default requests_per_unit) at once and refill/drain at
requests_per_unit per window. `reset` is the time until the next hit would be allowed when
over, and the time until the bucket is back to full capacity when within.
Float arithmetic mirrors the Lua twins operation by operation.
"""

from __future__ import annotations

import math

from rls.engine.algorithms.base import GRACE_MS, Evaluation, burst_of
from rls.engine.model import Check

Bucket = tuple[float, int] | None  # (tokens or level, last update ms)


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

    def _refill_ms(self, missing: float, check: Check) -> int:
        cap = check.limit.requests_per_unit
        if cap <= 0:
            return check.limit.window_ms
        return math.ceil(missing * float(check.limit.window_ms) / float(cap))

    def evaluate(self, state: Bucket, now_ms: int, check: Check) -> Evaluation:
        tokens = self._tokens(state, now_ms, check)
        hits = check.hits
        need = max(hits, 1)
        ok = tokens >= need
        burst = burst_of(check)
        if ok:
            reset = self._refill_ms(float(burst) - (tokens - float(hits)), check)
        else:
            reset = self._refill_ms(float(need) - tokens, check)
        remaining = max(0, math.floor(tokens - float(hits)))
        return ok, remaining, max(0, math.floor(tokens)), reset, max(0, burst - math.floor(tokens))

    def charge(self, state: Bucket, now_ms: int, check: Check) -> tuple[Bucket, int]:
        tokens = self._tokens(state, now_ms, check) - float(check.hits)
        full_in = self._refill_ms(float(burst_of(check)) - tokens, check)
        return (tokens, now_ms), now_ms + full_in + GRACE_MS

    def release(self, state: Bucket, now_ms: int, check: Check) -> tuple[Bucket, int]:
        burst = float(burst_of(check))
        tokens = min(burst, self._tokens(state, now_ms, check) + float(check.hits))
        return (tokens, now_ms), now_ms + self._refill_ms(burst - tokens, check) + GRACE_MS


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

    def _drain_ms(self, amount: float, check: Check) -> int:
        cap = check.limit.requests_per_unit
        if cap <= 0:
            return check.limit.window_ms
        return math.ceil(amount * float(check.limit.window_ms) / float(cap))

    def evaluate(self, state: Bucket, now_ms: int, check: Check) -> Evaluation:
        level = self._level(state, now_ms, check)
        burst = float(burst_of(check))
        hits = check.hits
        need = max(hits, 1)
        ok = level + float(need) <= burst
        if ok:
            reset = self._drain_ms(level + float(hits), check)
        else:
            reset = self._drain_ms(level + float(need) - burst, check)
        return (
            ok,
            max(0, math.floor(burst - level - float(hits))),
            max(0, math.floor(burst - level)),
            reset,
            math.floor(level),
        )

    def charge(self, state: Bucket, now_ms: int, check: Check) -> tuple[Bucket, int]:
        level = self._level(state, now_ms, check) + float(check.hits)
        return (level, now_ms), now_ms + self._drain_ms(level, check) + GRACE_MS

    def release(self, state: Bucket, now_ms: int, check: Check) -> tuple[Bucket, int]:
        level = max(0.0, self._level(state, now_ms, check) - float(check.hits))
        return (level, now_ms), now_ms + self._drain_ms(level, check) + GRACE_MS


class Gcra:
    """Generic cell rate algorithm: state is the theoretical arrival time (TAT) in ms."""

    def _tat(self, state: float | None, now_ms: int) -> float:
        return float(now_ms) if state is None else max(state, float(now_ms))

    def evaluate(self, state: float | None, now_ms: int, check: Check) -> Evaluation:
        cap = check.limit.requests_per_unit
        burst = burst_of(check)
        hits = check.hits
        if cap <= 0 or burst <= 0:
            return False, 0, 0, check.limit.window_ms, 0
        interval = float(check.limit.window_ms) / float(cap)
        tat = self._tat(state, now_ms)
        need = max(hits, 1)
        horizon = float(burst) * interval
        ok = tat + float(need) * interval - float(now_ms) <= horizon
        new_tat = tat + float(hits) * interval
        if ok:
            reset = math.ceil(new_tat - float(now_ms))
        else:
            reset = math.ceil(tat + float(need) * interval - horizon - float(now_ms))
        uncharged = max(0, math.floor((horizon - (tat - float(now_ms))) / interval))
        charged = max(0, math.floor((horizon - (new_tat - float(now_ms))) / interval))
        return ok, charged, uncharged, reset, max(0, burst - uncharged)

    def charge(self, state: float | None, now_ms: int, check: Check) -> tuple[float, int]:
        interval = float(check.limit.window_ms) / float(check.limit.requests_per_unit)
        tat = self._tat(state, now_ms) + float(check.hits) * interval
        return tat, math.ceil(tat) + GRACE_MS

    def release(self, state: float | None, now_ms: int, check: Check) -> tuple[float, int]:
        cap = check.limit.requests_per_unit
        interval = float(check.limit.window_ms) / float(max(cap, 1))
        tat = max(float(now_ms), self._tat(state, now_ms) - float(check.hits) * interval)
        return tat, math.ceil(tat) + GRACE_MS
