"""Reference models of the seven algorithms and of the admission rule, for differential tests.

Written from the documented semantics (DESIGN.md §5-§6 and the algorithm module docstrings),
not from rls's classes: each model keeps the most literal state it can (every window's count,
every log entry, an exact bucket level) and uses exact arithmetic (`Fraction`), so it is easy
to check by reading.

Every model answers the same question for a check of `hits` at time `now`:
`available(now)` is how many hits fit right now (exact; may be fractional for the buckets and
negative after `charge: always` overshoots). A check has room when `available >= max(hits, 1)`
(a 0-hit check asks whether one more hit would fit, DESIGN §6). The remaining figures are
`max(0, floor(available - hits))` when charged and `max(0, floor(available))` when not, and
`used_of(available)` gives the `used` figure each algorithm reports.

rls computes the bucket algorithms (token bucket, leaky bucket, GCRA) in IEEE doubles. Those
models set `tolerant = True` and track `exact(now)`: whether the quantity behind the verdict is
free of fractions that doubles cannot hold (every intermediate is a dyadic rational of at most 53
significant bits, so IEEE arithmetic on it is exact). When it is, everything is compared
exactly. When it is not (a refill of 0.3 token, an emission interval of 1000/3 ms), decisions
are still compared exactly except when the exact quantity lies within `EPS` of the threshold:
there float rounding legitimately decides, and the replay follows the backend's verdict; the
integer figures (remaining, used) may then be the floor of `available +- EPS`.
EPS (1e-4 hits) lies between the accumulated float error of a short trace (about 1e-6 hits
per operation at worst, for GCRA's absolute times near 1.8e12 ms whose doubles step by 2^-12 ms)
and the smallest non-zero distance to a threshold that integer-millisecond traces can produce
(1 / window_ms >= 3.3e-4 hits).
The other models are integer-exact and always compared exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

SHADOW, QUOTA, CHARGE_ALWAYS, NEGATIVE = 1, 2, 4, 8
EPS = Fraction(1, 10**4)

Bounds = Callable[[int], tuple[int, int, int]]  # now -> (window start, end, previous start)


def _double(x: Fraction) -> bool:
    """x is exactly representable as an IEEE double."""
    d = x.denominator
    return d & (d - 1) == 0 and abs(x.numerator) < 2**53


def epoch_bounds(window_ms: int) -> Bounds:
    def bounds(now: int) -> tuple[int, int, int]:
        start = now // window_ms * window_ms
        return start, start + window_ms, start - window_ms

    return bounds


class Model:
    tolerant = False

    def available(self, now: int) -> Fraction:
        raise NotImplementedError

    def exact(self, now: int) -> bool:
        """Whether the quantity behind the verdict at `now` holds no fraction that doubles
        cannot represent (see the module docstring); always true for the integer models."""
        return True

    def used_of(self, available: Fraction, now: int) -> int:
        raise NotImplementedError

    def reset(self, now: int) -> int | None:
        """Expected reset_ms where the semantics pin it down; None: not checked."""
        return None

    def charge(self, now: int, hits: int) -> None:
        raise NotImplementedError

    def release(self, now: int, hits: int) -> None:
        raise NotImplementedError


# --- fixed window ---------------------------------------------------------------------------


class FixedWindowModel(Model):
    """Counts per window. Overdraft D: a window that starts free of debt may use limit + D;
    what a window used beyond the limit is owed by the next window, which starts with that
    usage already counted and may use only up to the limit (no borrowing while in debt)."""

    def __init__(self, limit: int, overdraft: int, bounds: Bounds) -> None:
        self.limit = limit
        self.overdraft = overdraft
        self.bounds = bounds
        self.windows: dict[int, list[int]] = {}  # start -> [usage incl. debt, debt at start]

    def _window(self, now: int) -> list[int]:
        start, _, prev = self.bounds(now)
        if start not in self.windows:
            debt = 0
            if self.overdraft > 0 and prev in self.windows:
                debt = max(0, self.windows[prev][0] - self.limit)
            return [debt, debt]  # a window nobody has touched yet (not stored)
        return self.windows[start]

    def _top(self, debt: int) -> int:
        return self.limit + (self.overdraft if debt == 0 else 0)

    def available(self, now: int) -> Fraction:
        usage, debt = self._window(now)
        return Fraction(self._top(debt) - usage)

    def used_of(self, available: Fraction, now: int) -> int:
        return self._window(now)[0]

    def reset(self, now: int) -> int | None:
        return self.bounds(now)[1] - now

    def charge(self, now: int, hits: int) -> None:
        usage, debt = self._window(now)
        self.windows[self.bounds(now)[0]] = [usage + hits, debt]

    def release(self, now: int, hits: int) -> None:
        usage, debt = self._window(now)
        self.windows[self.bounds(now)[0]] = [max(0, usage - hits), debt]


class RollingWindowModel(Model):
    """`window: rolling_from_first_hit`: the first charge of at least one hit opens a window of
    `window_ms` at that instant; hits count in it until it ends; then the key has no window
    until the next such charge. Without a window: the whole limit available, the full window
    as reset, and 0-hit charges and releases change nothing."""

    def __init__(self, limit: int, window_ms: int) -> None:
        self.limit = limit
        self.window = window_ms
        self.start: int | None = None
        self.usage = 0

    def _live(self, now: int) -> bool:
        return self.start is not None and now < self.start + self.window

    def available(self, now: int) -> Fraction:
        return Fraction(self.limit - (self.usage if self._live(now) else 0))

    def used_of(self, available: Fraction, now: int) -> int:
        return self.usage if self._live(now) else 0

    def reset(self, now: int) -> int | None:
        if self._live(now):
            assert self.start is not None
            return self.start + self.window - now
        return self.window

    def charge(self, now: int, hits: int) -> None:
        if self._live(now):
            self.usage += hits
        elif hits > 0:
            self.start, self.usage = now, hits

    def release(self, now: int, hits: int) -> None:
        if self._live(now):
            self.usage = max(0, self.usage - hits)


# --- sliding window -------------------------------------------------------------------------


class SlidingWindowModel(Model):
    """Counts per epoch window; usage = floor(previous count x the share of the previous
    window still inside the sliding window) + current count. Releases lower the current count.
    Only a floor of an integer quotient: exact in doubles too, so compared exactly."""

    def __init__(self, limit: int, window_ms: int) -> None:
        self.limit = limit
        self.window = window_ms
        self.counts: dict[int, int] = {}

    def _used(self, now: int) -> int:
        start = now // self.window * self.window
        prev = self.counts.get(start - self.window, 0)
        weight = Fraction(self.window - (now - start), self.window)
        return math.floor(prev * weight) + self.counts.get(start, 0)

    def available(self, now: int) -> Fraction:
        return Fraction(self.limit - self._used(now))

    def used_of(self, available: Fraction, now: int) -> int:
        return self.limit - int(available)

    def charge(self, now: int, hits: int) -> None:
        start = now // self.window * self.window
        self.counts[start] = self.counts.get(start, 0) + hits

    def release(self, now: int, hits: int) -> None:
        start = now // self.window * self.window
        self.counts[start] = max(0, self.counts.get(start, 0) - hits)


# --- exact logs -----------------------------------------------------------------------------


class LogModel(Model):
    """Every charge is an entry (time, hits); entries with time > now - window count.
    Sliding log releases take back the newest hits, concurrency releases the oldest leases."""

    release_oldest = False

    def __init__(self, limit: int, window_ms: int) -> None:
        self.limit = limit
        self.window = window_ms
        self.entries: list[list[int]] = []  # [time, hits], in charge order (= time order)

    def _live(self, now: int) -> list[list[int]]:
        return [e for e in self.entries if e[0] > now - self.window]

    def available(self, now: int) -> Fraction:
        return Fraction(self.limit - sum(h for _, h in self._live(now)))

    def used_of(self, available: Fraction, now: int) -> int:
        return self.limit - int(available)

    def charge(self, now: int, hits: int) -> None:
        self.entries = self._live(now)
        if hits > 0:
            self.entries.append([now, hits])

    def release(self, now: int, hits: int) -> None:
        live = self._live(now)
        order = live if self.release_oldest else list(reversed(live))
        for entry in order:
            take = min(hits, entry[1])
            entry[1] -= take
            hits -= take
        self.entries = [e for e in live if e[1] > 0]


class SlidingLogModel(LogModel):
    release_oldest = False


class ConcurrencyModel(LogModel):
    release_oldest = True


# --- buckets (exact rationals; rls uses doubles) --------------------------------------------


class TokenBucketModel(Model):
    """Starts full with `burst` tokens, refills at limit per window up to `burst`; a hit takes
    a token (charge: always may take the bucket below zero); a release puts tokens back."""

    tolerant = True

    def __init__(self, limit: int, window_ms: int, burst: int) -> None:
        self.rate = Fraction(limit, window_ms)  # tokens per ms
        self.burst = Fraction(burst)
        self.tokens = self.burst
        self.last: int | None = None
        self.exact_state = True

    def _now(self, now: int) -> tuple[Fraction, bool]:
        if self.last is None:
            return self.burst, True
        gain = (now - self.last) * self.rate
        tokens = self.tokens + gain
        exact = self.exact_state and _double(gain) and _double(tokens)
        return _capped(tokens, self.burst, exact)

    def available(self, now: int) -> Fraction:
        return self._now(now)[0]

    def exact(self, now: int) -> bool:
        return self._now(now)[1]

    def used_of(self, available: Fraction, now: int) -> int:
        return max(0, int(self.burst) - math.floor(available))

    def charge(self, now: int, hits: int) -> None:
        tokens, exact = self._now(now)
        self.tokens, self.last = tokens - hits, now
        self.exact_state = exact and _double(self.tokens)

    def release(self, now: int, hits: int) -> None:
        tokens, exact = self._now(now)
        self.tokens, self.exact_state = _capped(tokens + hits, self.burst, exact)
        self.last = now


class LeakyBucketModel(Model):
    """Meter: each hit pours one unit into a bucket of size `burst` that leaks at limit per
    window (never below empty); a hit fits when the bucket would not overflow."""

    tolerant = True

    def __init__(self, limit: int, window_ms: int, burst: int) -> None:
        self.rate = Fraction(limit, window_ms)
        self.burst = burst
        self.level = Fraction(0)
        self.last = 0
        self.exact_state = True

    def _level(self, now: int) -> tuple[Fraction, bool]:
        loss = (now - self.last) * self.rate
        level = self.level - loss
        exact = self.exact_state and _double(loss) and _double(level)
        return _floored(level, Fraction(0), exact)

    def available(self, now: int) -> Fraction:
        return self.burst - self._level(now)[0]

    def exact(self, now: int) -> bool:
        return self._level(now)[1]

    def used_of(self, available: Fraction, now: int) -> int:
        return math.floor(self.burst - available)

    def charge(self, now: int, hits: int) -> None:
        level, exact = self._level(now)
        self.level, self.last = level + hits, now
        self.exact_state = exact and _double(self.level)

    def release(self, now: int, hits: int) -> None:
        level, exact = self._level(now)
        self.level, self.exact_state = _floored(level - hits, Fraction(0), exact)
        self.last = now


class GcraModel(Model):
    """Theoretical arrival time TAT; emission interval T = window / limit; a hit conforms when
    TAT (never earlier than now) + T - now <= burst x T (i.e. at most `burst` hits ahead);
    a charge pushes TAT by hits x T, a release pulls it back (never before now)."""

    tolerant = True

    def __init__(self, limit: int, window_ms: int, burst: int) -> None:
        assert limit > 0, "the model covers limit >= 1 (see test_properties for limit 0)"
        self.interval = Fraction(window_ms, limit)
        self.burst = burst
        self.tat: Fraction | None = None
        self.exact_state = True

    def _tat(self, now: int) -> tuple[Fraction, bool]:
        if self.tat is None:
            return Fraction(now), True
        return _floored(self.tat, Fraction(now), self.exact_state)

    def available(self, now: int) -> Fraction:
        # hits that still fit before TAT runs burst x T ahead of now
        return self.burst - (self._tat(now)[0] - now) / self.interval

    def exact(self, now: int) -> bool:
        # Exact in relative terms: an idle limit (TAT not after now) holds no fraction at all,
        # so its verdict is an integer comparison (need <= burst) that doubles decide exactly;
        # otherwise TAT - now must be a double and so must T.
        tat, exact = self._tat(now)
        if tat == now:
            return True
        return exact and _double(self.interval) and _double(tat - now + 8 * self.interval)

    def used_of(self, available: Fraction, now: int) -> int:
        return max(0, self.burst - max(0, math.floor(available)))

    def charge(self, now: int, hits: int) -> None:
        tat, exact = self._tat(now)
        self.tat = tat + hits * self.interval
        self.exact_state = exact and _double(self.interval) and _double(self.tat)

    def release(self, now: int, hits: int) -> None:
        tat, exact = self._tat(now)
        exact = exact and _double(self.interval)
        self.tat, self.exact_state = _floored(tat - hits * self.interval, Fraction(now), exact)


def _capped(value: Fraction, cap: Fraction, exact: bool) -> tuple[Fraction, bool]:
    """min(cap, value) and whether the double result is exact: it is when the input was, or
    when value is so far above cap that rounding cannot bring it below."""
    if value >= cap + EPS or (exact and value >= cap):
        return cap, True
    return min(cap, value), exact


def _floored(value: Fraction, floor: Fraction, exact: bool) -> tuple[Fraction, bool]:
    """max(floor, value), with the same exactness reasoning as `_capped`."""
    if value <= floor - EPS or (exact and value <= floor):
        return floor, True
    return max(floor, value), exact


def make_model(
    algorithm: str,
    limit: int,
    window_ms: int,
    burst: int | None = None,
    overdraft: int = 0,
    bounds: Bounds | None = None,
) -> Model:
    cap = limit if burst is None else burst
    if algorithm == "fixed_window":
        return FixedWindowModel(limit, overdraft, bounds or epoch_bounds(window_ms))
    if algorithm == "sliding_window":
        return SlidingWindowModel(limit, window_ms)
    if algorithm == "sliding_log":
        return SlidingLogModel(limit, window_ms)
    if algorithm == "concurrency":
        return ConcurrencyModel(limit, window_ms)
    if algorithm == "token_bucket":
        return TokenBucketModel(limit, window_ms, cap)
    if algorithm == "leaky_bucket":
        return LeakyBucketModel(limit, window_ms, cap)
    if algorithm == "gcra":
        return GcraModel(limit, window_ms, cap)
    raise ValueError(algorithm)


# --- admission rule -------------------------------------------------------------------------


def admission(flags: Sequence[int], room: Sequence[bool]) -> tuple[bool, list[bool]]:
    """DESIGN §6: admitted when every enforcing check has room and, if there are quota checks,
    at least one of them has room (a shadow check always counts as having room). Releases
    (NEGATIVE) take no part in the decision. Charged: releases and `charge: always` limits
    always; otherwise, in an admitted request, every check with room and every shadow check."""
    deciding = [
        (f, ok or bool(f & SHADOW)) for f, ok in zip(flags, room, strict=True) if not f & NEGATIVE
    ]
    enforcing_ok = all(ok for f, ok in deciding if not f & QUOTA)
    quota = [ok for f, ok in deciding if f & QUOTA]
    admitted = enforcing_ok and (not quota or any(quota))
    charged = [
        bool(f & NEGATIVE) or bool(f & CHARGE_ALWAYS) or (admitted and (ok or bool(f & SHADOW)))
        for f, ok in zip(flags, room, strict=True)
    ]
    return admitted, charged


# --- replaying a request on the models ------------------------------------------------------


@dataclass
class Expected:
    """What the model allows for one check: exact sets of acceptable values."""

    ok: bool
    charged: bool
    remaining: set[int]
    used: set[int]
    reset: int | None
    boundary: bool = False  # the room verdict sat on the threshold (float rounding decides)


@dataclass
class ModelStore:
    models: dict[str, Model] = field(default_factory=dict)

    def decide(
        self,
        now: int,
        checks: Sequence[tuple[str, int, int]],
        actual_oks: Sequence[bool] | None = None,
    ) -> tuple[bool, list[Expected]]:
        """Decide a request of (key, hits, flags) checks; keys must be distinct and known.

        `actual_oks`: the backend's room verdicts, used only where the exact verdict sits within
        EPS of the threshold of a float algorithm (see the module docstring)."""
        keys = [k for k, _, _ in checks]
        assert len(set(keys)) == len(keys), "one check per key in a request"
        avail: list[Fraction] = []
        room: list[bool] = []
        boundary: list[bool] = []
        for i, (key, hits, _) in enumerate(checks):
            model = self.models[key]
            a = model.available(now)
            margin = a - max(hits, 1)
            on_edge = model.tolerant and abs(margin) < EPS and not model.exact(now)
            ok = actual_oks[i] if on_edge and actual_oks is not None else margin >= 0
            avail.append(a)
            room.append(ok)
            boundary.append(on_edge)
        admitted, charged = admission([f for _, _, f in checks], room)
        out: list[Expected] = []
        for i, (key, hits, flags) in enumerate(checks):
            model = self.models[key]
            a, ok, exact = avail[i], room[i], model.exact(now)
            used = _around(exact, a, lambda x, m=model: m.used_of(x, now))
            reset = model.reset(now)
            if charged[i] and flags & NEGATIVE:
                model.release(now, hits)
                after = model.available(now)
                remaining = _around(model.exact(now), after, lambda x: max(0, math.floor(x)))
                out.append(Expected(True, True, remaining, used, reset, boundary[i]))
            elif charged[i]:
                model.charge(now, hits)
                remaining = _around(exact, a, lambda x, h=hits: max(0, math.floor(x - h)))
                out.append(Expected(ok, True, remaining, used, reset, boundary[i]))
            else:
                remaining = _around(exact, a, lambda x: max(0, math.floor(x))) if ok else {0}
                out.append(Expected(ok, False, remaining, used, reset, boundary[i]))
        return admitted, out


def _around(exact: bool, value: Fraction, fig: Callable[[Fraction], int]) -> set[int]:
    if exact:
        return {fig(value)}
    return {fig(value - EPS), fig(value), fig(value + EPS)}
