"""Local over-limit cache: a key found over limit is answered in-process until its reset.

Under a flood from one over-limit caller this keeps Redis at 0 round trips per call. Only for
checks that can't come back early: not `concurrency` (any replica may release a lease), not
shadow or quota checks, and never for requests carrying releases or `charge: always` limits
(those must reach the store). A release seen here drops the key; a release sent to another
replica is seen here only after the reset. Cleared on config reload.
"""

from __future__ import annotations

import time

from rls.core.model import CHARGE_ALWAYS, NEGATIVE, QUOTA, SHADOW, Check, Outcome
from rls.engine.decision import OVER_LIMIT, Status
from rls.observability.metrics import Metrics

MAX_KEYS = 100_000
_NOT_CACHEABLE = SHADOW | QUOTA | NEGATIVE | CHARGE_ALWAYS
_RELEASABLE = frozenset({"concurrency"})  # room comes back early through any replica


def _now_ms() -> int:
    return int(time.time() * 1000)


class OverLimitCache:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        # key -> (over until, in local ms; smallest cost known not to fit)
        self._known: dict[str, tuple[int, int]] = {}

    def __bool__(self) -> bool:
        return bool(self._known)

    def clear(self) -> None:
        self._known.clear()

    def remember(self, checks: list[Check], outcomes: list[Outcome]) -> None:
        now = _now_ms()
        known = self._known
        if len(known) > MAX_KEYS:
            known.clear()
        for check, out in zip(checks, outcomes, strict=True):
            if (
                not out.ok
                and not out.charged
                and not check.flags & _NOT_CACHEABLE
                and check.limit.algorithm not in _RELEASABLE
                # a settle on any replica gives room back (docs/token-budgets.md)
                and check.limit.reserve is None
            ):
                known[check.key] = (now + out.reset_ms, max(check.hits, 1))

    def answer(self, checks: list[Check], statuses: list[Status]) -> Check | None:
        """The check that rejects the request without a round trip (known over until its
        reset), with its descriptor's status filled in; None when the store must decide.

        The caller reports the request's other descriptors (uncharged: the request is
        rejected)."""
        now = _now_ms()
        known = self._known
        hit: tuple[Check, int] | None = None
        for check in checks:
            if check.flags & NEGATIVE:
                known.pop(check.key, None)  # a release makes room: ask the backend again
                return None
            if check.flags & CHARGE_ALWAYS:
                return None
            entry = known.get(check.key)
            if entry is None:
                continue
            if entry[0] <= now:
                del known[check.key]
            elif (
                hit is None
                and not check.flags & (SHADOW | QUOTA)
                and max(check.hits, 1) >= entry[1]
            ):
                hit = (check, entry[0] - now)
        if hit is None:
            return None
        check, reset_ms = hit
        status = statuses[check.descriptor]
        status.code, status.limit, status.remaining, status.reset_ms = (
            OVER_LIMIT,
            check.limit,
            0,
            reset_ms,
        )
        self.metrics.count_local_cache_over(check.limit, check.stats_key, check.hits)
        self.metrics.record_limit(
            check.limit, check.stats_key, check.hits, check.limit.requests_per_unit, True, False
        )
        return check
