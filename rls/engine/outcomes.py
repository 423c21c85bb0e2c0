"""A decision's outcomes folded into per-descriptor statuses, and the Limits that requests'
RateLimitOverrides carry: the limiter's two pure steps around its store call."""

from __future__ import annotations

from rls.config.model import UNIT_SECONDS, Limit, Unit
from rls.core.model import NEGATIVE, QUOTA, SHADOW, Check, Outcome
from rls.engine.decision import OK, OVER_LIMIT, DescriptorIn, InvalidRequest, Status
from rls.observability.metrics import Metrics

MAX_OVERRIDE_SHAPES = 1024
_UNITS = frozenset(int(u) for u in Unit)


def fold_outcomes(
    metrics: Metrics, checks: list[Check], outcomes: list[Outcome], statuses: list[Status]
) -> int:
    """Fold check outcomes into per-descriptor statuses; return the overall code."""
    overall = OK
    quota_seen = quota_room = False
    record_limit = metrics.record_limit
    for check, out in zip(checks, outcomes, strict=True):
        limit = check.limit
        flags = check.flags
        shadow = bool(flags & SHADOW)
        if not flags & NEGATIVE:
            record_limit(limit, check.stats_key, check.hits, out.used, not out.ok, shadow)
        status = statuses[check.descriptor]
        over = not out.ok and not shadow
        if flags & QUOTA and not flags & NEGATIVE:
            quota_seen = True
            quota_room = quota_room or not over
        elif over:
            overall = OVER_LIMIT
        remaining = 0 if not out.ok else out.remaining
        if status.limit is None or _tighter(over, remaining, out.reset_ms, status):
            status.code = OVER_LIMIT if over else OK
            status.limit = limit
            status.remaining = remaining
            status.reset_ms = out.reset_ms
    if quota_seen and not quota_room:
        overall = OVER_LIMIT
    return overall


def _tighter(over: bool, remaining: int, reset_ms: int, current: Status) -> bool:
    """Whether a check should replace the one a descriptor currently reports."""
    if over:
        if current.code != OVER_LIMIT:
            return True
        return reset_ms > (current.reset_ms or 0)  # report when the caller is let in again
    return remaining < current.remaining


class OverrideLimits:
    """The Limits of requests' RateLimitOverrides, one per (domain, limit, entry keys) shape
    (at most MAX_OVERRIDE_SHAPES kept; past that each is built anew)."""

    def __init__(self) -> None:
        self._known: dict[tuple[object, ...], Limit] = {}

    def limit(self, domain: str, desc: DescriptorIn) -> Limit:
        """Limit from a request's RateLimitOverride, cached per shape (bounded).

        Its stats key names the entry keys, not their values, so requests carrying overrides for
        unique values cannot grow the metrics without bound (reference issue #275).
        """
        assert desc.override is not None
        rpu, unit, multiplier = desc.override
        key = (domain, rpu, unit, multiplier, *(k for k, _ in desc.entries))
        limit = self._known.get(key)
        if limit is None:
            if unit not in _UNITS or Unit(unit) not in UNIT_SECONDS:
                raise InvalidRequest(f"limit override has an invalid unit {unit}")
            full_key = ".".join([domain, *(k for k, _ in desc.entries), "override"])
            limit = Limit(
                requests_per_unit=rpu,
                unit=Unit(unit),
                unit_multiplier=max(1, multiplier),
                full_key=full_key,
                ident=f"o{UNIT_SECONDS[Unit(unit)] * max(1, multiplier)}",
            )
            if len(self._known) < MAX_OVERRIDE_SHAPES:
                self._known[key] = limit
        return limit
