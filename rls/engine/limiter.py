"""ShouldRateLimit decisions: match descriptors, build checks, ask the backend once, report.

The service layer hands in plain values (no protobuf), so the same path serves gRPC, the admin
`/json` endpoint and tests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from rls.backends.base import Backend, BackendError
from rls.config.model import UNIT_SECONDS, Domain, Limit, RateLimitConfig, Unit
from rls.engine.calendar import CalendarCache
from rls.engine.checks import match_cost, match_targets, merge_same_counter, passed_metadata
from rls.engine.decision import (
    OK,
    OVER_LIMIT,
    UNLIMITED_REMAINING,
    Decision,
    DescriptorIn,
    InvalidRequest,
    Status,
)
from rls.engine.fallback import FallbackLimiter
from rls.engine.keys import counter_key
from rls.engine.local_cache import OverLimitCache
from rls.engine.model import CHARGE_ALWAYS, NEGATIVE, QUOTA, SHADOW, Check, Outcome
from rls.engine.usage import UsageOp, usage_ops
from rls.metrics import Metrics
from rls.settings import Settings

log = logging.getLogger("rls.limiter")

# The decision values are defined in rls.engine.decision and re-exported here for callers.
__all__ = [
    "OK",
    "OVER_LIMIT",
    "UNLIMITED_REMAINING",
    "Decision",
    "DescriptorIn",
    "InvalidRequest",
    "RateLimiter",
    "Status",
]


class RateLimiter:
    def __init__(
        self,
        config: Callable[[], RateLimitConfig | None],
        backend: Backend,
        settings: Settings,
        metrics: Metrics,
    ) -> None:
        self._config = config
        self.backend = backend
        self.settings = settings
        self.metrics = metrics
        self._overrides: dict[tuple[object, ...], Limit] = {}
        self._calendar = CalendarCache()
        self._decide_now = getattr(backend, "decide_now", None)
        self._roundtrips = metrics.backend_calls.labels(backend.name)
        self._backend_errors = metrics.backend_errors.labels(backend.name, settings.failure_mode)
        self._last_failure_log = 0.0
        self._suppressed = 0
        # In-process answers for keys known over limit (Redis only: memory needs no shortcut).
        self._over_cache = (
            OverLimitCache(metrics) if self._decide_now is None and settings.local_cache else None
        )
        self._fallback = FallbackLimiter(settings.fallback_share, metrics)

    async def should_rate_limit(
        self,
        domain: str,
        descriptors: Sequence[DescriptorIn],
        request_hits: int = 0,
        now_ms: int | None = None,
    ) -> Decision:
        config = self._config()
        if config is None:
            raise RuntimeError("no rate limit configuration loaded")
        statuses = [Status() for _ in descriptors]
        dom = config.domains.get(domain)
        if dom is None:
            self.metrics.domain_not_found.inc(len(descriptors))
            self.metrics.count_request("_unknown", "OK")
            return Decision(OK, statuses)

        settings = self.settings
        checks = self._checks(dom, domain, descriptors, request_hits, now_ms, statuses)
        usage: list[UsageOp] = []
        if dom.usage is not None:
            clock_ms = now_ms if now_ms is not None else int(time.time() * 1000)
            usage = usage_ops(
                dom.usage, settings.key_prefix, domain, [d.entries for d in descriptors], clock_ms
            )
        over_cache = self._over_cache
        answered_locally = bool(checks and over_cache and over_cache.answer(checks, statuses))
        if usage and (answered_locally or not checks):
            # Every call counts in usage, also those decided without the decision round trip.
            await self._record_usage_alone(usage, dom.usage.ttl_ms, now_ms)
        overall = OVER_LIMIT if answered_locally else OK
        if checks and not answered_locally:
            outcomes = await self._decide(checks, now_ms, usage, dom)
            from_backend = outcomes is not None
            if outcomes is None and settings.fallback_share > 0:
                outcomes = self._fallback.decide(checks, now_ms)
            if outcomes is None:
                mode = dom.failure_mode or settings.failure_mode
                overall = OK if mode == "allow" or settings.limiting_off else OVER_LIMIT
                self.metrics.count_request(domain, _CODE[overall])
                return Decision(overall, statuses)
            overall = self._report(checks, outcomes, statuses)
            if over_cache is not None and overall == OVER_LIMIT and from_backend:
                over_cache.remember(checks, outcomes)  # never a fallback (local-share) verdict
        if overall == OVER_LIMIT and (
            settings.shadow_mode or settings.limiting_off or domain in settings.shadow_domains
        ):
            if not settings.limiting_off:
                self.metrics.global_shadow.inc()
            overall = OK
        self.metrics.count_request(domain, _CODE[overall])
        decision = Decision(overall, statuses)
        if settings.dynamic_metadata:
            decision.metadata = passed_metadata(dom, descriptors, statuses)
        return decision

    def _checks(
        self,
        dom: Domain,
        domain: str,
        descriptors: Sequence[DescriptorIn],
        request_hits: int,
        now_ms: int | None,
        statuses: list[Status],
    ) -> list[Check]:
        """Match every descriptor and turn each applicable limit into a Check.

        Unlimited limits are answered here (remaining 2^32-1); replaced ones are dropped.
        """
        settings = self.settings
        default_hits = request_hits if request_hits > 0 else 1
        matched: list[tuple[int, Limit, str, str | None, int, bool]] = []
        replaced: set[str] = set()
        memo = dom.memo
        prefix = settings.key_prefix
        for i, desc in enumerate(descriptors):
            hits = default_hits if desc.hits is None else desc.hits
            if desc.override is not None:
                limit = self._override_limit(domain, desc)
                key = counter_key(prefix, domain, desc.entries, limit.ident)
                matched.append((i, limit, key, None, hits, desc.negative))
                continue
            targets = memo.get(desc.entries)
            if targets is None:
                targets = match_targets(dom, domain, desc.entries, prefix)
                memo.put(desc.entries, targets, match_cost(desc.entries, targets))
            for limit, key, dyn, _ in targets:
                if limit.replaces:
                    replaced.update(limit.replaces)
                matched.append((i, limit, key, dyn, hits, desc.negative))

        checks: list[Check] = []
        for i, limit, key, dyn, hits, negative in matched:
            if limit.name and limit.name in replaced:
                continue
            if limit.unlimited:
                statuses[i].remaining = UNLIMITED_REMAINING
                continue
            flags = 0
            if limit.shadow_mode:
                flags |= SHADOW
            if limit.quota_mode or settings.quota_mode:
                flags |= QUOTA
            if limit.charge_always:
                flags |= CHARGE_ALWAYS
            if negative:
                if not limit.accept_releases:  # see Limit.accept_releases
                    self.metrics.releases_ignored.labels(domain).inc()
                    continue
                flags |= NEGATIVE
            bounds = None
            if limit.calendar:
                clock_ms = now_ms if now_ms is not None else int(time.time() * 1000)
                bounds = self._calendar.bounds(limit, clock_ms)
            checks.append(Check(i, limit, key, hits, flags, dyn, bounds))

        return checks

    def clear_local_cache(self) -> None:
        """Forget locally known over-limit keys (a config reload may change the limits)."""
        if self._over_cache is not None:
            self._over_cache.clear()

    async def query(
        self, domain: str, descriptors: Sequence[DescriptorIn], now_ms: int | None = None
    ) -> list[list[tuple[Limit, Outcome]]]:
        """Per descriptor, each matched limit with its current usage — nothing is charged."""
        config = self._config()
        if config is None:
            raise RuntimeError("no rate limit configuration loaded")
        dom = config.domains.get(domain)
        result: list[list[tuple[Limit, Outcome]]] = [[] for _ in descriptors]
        if dom is None:
            return result
        statuses = [Status() for _ in descriptors]
        checks = self._checks(dom, domain, descriptors, 0, now_ms, statuses)
        for check in checks:
            check.hits = 0
            check.flags &= SHADOW | QUOTA
        if not checks:
            return result
        if self._decide_now is not None:
            verdict = self._decide_now(checks, now_ms, charge=False)
        else:
            async with asyncio.timeout(max(self.settings.backend_timeout_ms, 1000) / 1000):
                verdict = await self.backend.peek(checks, now_ms)
        for check, out in zip(checks, verdict.outcomes, strict=True):
            result[check.descriptor].append((check.limit, out))
        return result

    async def _record_usage_alone(
        self, usage: list[UsageOp], ttl_ms: int, now_ms: int | None
    ) -> None:
        """Usage of a request that matched no limit: recorded, failures only counted."""
        try:
            async with asyncio.timeout(self.settings.backend_timeout_ms / 1000):
                await self.backend.record_usage(usage, ttl_ms, now_ms)
        except (BackendError, TimeoutError) as exc:
            self._backend_errors.inc()
            self._log_failure(exc)

    async def _decide(
        self,
        checks: list[Check],
        now_ms: int | None,
        usage: list[UsageOp] | None = None,
        dom: Domain | None = None,
    ) -> list[Outcome] | None:
        ttl = dom.usage.ttl_ms if usage and dom is not None and dom.usage is not None else 0
        if len(checks) > 1 and len({c.key for c in checks}) < len(checks):
            merged, slots = merge_same_counter(checks)
            if slots is not None:
                outcomes = await self._call_backend(merged, now_ms, usage, ttl)
                return None if outcomes is None else [outcomes[j] for j in slots]
        return await self._call_backend(checks, now_ms, usage, ttl)

    async def _call_backend(
        self,
        checks: list[Check],
        now_ms: int | None,
        usage: list[UsageOp] | None = None,
        usage_ttl_ms: int = 0,
    ) -> list[Outcome] | None:
        if self._decide_now is not None:  # in-process store: nothing to wait for
            if usage:
                self.backend.record_usage_now(usage, usage_ttl_ms, now_ms)  # type: ignore[attr-defined]
            return self._decide_now(checks, now_ms).outcomes
        backend = self.backend
        self._roundtrips.inc()
        try:
            async with asyncio.timeout(self.settings.backend_timeout_ms / 1000):
                if usage:
                    verdict = await backend.decide(checks, now_ms, usage, usage_ttl_ms)
                else:
                    verdict = await backend.decide(checks, now_ms)
        except (BackendError, TimeoutError) as exc:
            self._backend_errors.inc()
            self._log_failure(exc)
            return None
        return verdict.outcomes

    def _log_failure(self, exc: Exception) -> None:
        """At most one line per second, so a dead store cannot fill the disk."""
        now = time.monotonic()
        self._suppressed += 1
        if now - self._last_failure_log >= 1.0:
            log.warning(
                "backend %s failed (%d call(s) since last report): %s",
                self.backend.name,
                self._suppressed,
                str(exc) or type(exc).__name__,
            )
            self._last_failure_log = now
            self._suppressed = 0

    def _report(self, checks: list[Check], outcomes: list[Outcome], statuses: list[Status]) -> int:
        """Fold check outcomes into per-descriptor statuses; return the overall code."""
        overall = OK
        quota_seen = quota_room = False
        for check, out in zip(checks, outcomes, strict=True):
            limit = check.limit
            flags = check.flags
            shadow = bool(flags & SHADOW)
            if not flags & NEGATIVE:
                self.metrics.record_limit(
                    limit, check.stats_key, check.hits, out.used, not out.ok, shadow
                )
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

    def _override_limit(self, domain: str, desc: DescriptorIn) -> Limit:
        """Limit from a request's RateLimitOverride, cached per shape (bounded).

        Its stats key names the entry keys, not their values, so requests carrying overrides for
        unique values cannot grow the metrics without bound (reference issue #275).
        """
        assert desc.override is not None
        rpu, unit, multiplier = desc.override
        key = (domain, rpu, unit, multiplier, *(k for k, _ in desc.entries))
        limit = self._overrides.get(key)
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
            if len(self._overrides) < 1024:
                self._overrides[key] = limit
        return limit


def _tighter(over: bool, remaining: int, reset_ms: int, current: Status) -> bool:
    """Whether a check should replace the one a descriptor currently reports."""
    if over:
        if current.code != OVER_LIMIT:
            return True
        return reset_ms > (current.reset_ms or 0)  # report when the caller is let in again
    return remaining < current.remaining


_UNITS = frozenset(int(u) for u in Unit)


_CODE = {OK: "OK", OVER_LIMIT: "OVER_LIMIT"}
