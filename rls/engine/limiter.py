"""ShouldRateLimit decisions: match descriptors, build checks, ask the backend once, report.

The service layer hands in plain values (no protobuf), so the same path serves gRPC, the admin
`/json` endpoint and tests.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rls.backends.base import Backend, BackendError
from rls.backends.memory import MemoryBackend
from rls.config.matcher import match, needs_dynamic_stats, stats_key
from rls.config.model import UNIT_SECONDS, Domain, Limit, RateLimitConfig, Unit
from rls.engine.calendar import CalendarCache
from rls.engine.keys import counter_key
from rls.engine.model import CHARGE_ALWAYS, NEGATIVE, QUOTA, SHADOW, Check, Outcome
from rls.engine.usage import UsageOp, usage_ops
from rls.metrics import Metrics
from rls.settings import Settings

log = logging.getLogger("rls.limiter")

OK = 1
OVER_LIMIT = 2
UNLIMITED_REMAINING = 4294967295


@dataclass(slots=True)
class DescriptorIn:
    entries: tuple[tuple[str, str], ...]
    hits: int | None = None  # the descriptor's own hits_addend, if set (0 allowed)
    negative: bool = False  # is_negative_hits: give hits back
    override: tuple[int, int, int] | None = None  # (requests_per_unit, unit, multiplier)


@dataclass(slots=True)
class Status:
    code: int = OK
    limit: Limit | None = None
    remaining: int = 0
    reset_ms: int | None = None

    @property
    def reset_seconds(self) -> int | None:
        return None if self.reset_ms is None else math.ceil(self.reset_ms / 1000)


@dataclass(slots=True)
class Decision:
    overall: int
    statuses: list[Status]
    # Config `metadata` of the descriptors that passed, in request order (for dynamic metadata).
    metadata: list[dict[str, Any]] = field(default_factory=list)


class InvalidRequest(ValueError):
    """The request itself is wrong (INVALID_ARGUMENT); nothing was charged."""


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
        self._known_over: dict[str, tuple[int, int]] = {}
        self._local_cache = self._decide_now is None and settings.local_cache
        self._fallback = MemoryBackend()
        self._fallback_calls = 0
        self._scaled_limits: dict[int, tuple[Limit, Limit]] = {}

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
            if not checks and usage:
                await self._record_usage_alone(usage, dom.usage.ttl_ms, now_ms)
        if checks and self._known_over and self._answer_locally(checks, statuses):
            self.metrics.count_request(domain, "OVER_LIMIT")
            overall = OVER_LIMIT
            if settings.shadow_mode or settings.limiting_off or domain in settings.shadow_domains:
                overall = OK
            return Decision(overall, statuses)
        overall = OK
        if checks:
            outcomes = await self._decide(checks, now_ms, usage, dom)
            if outcomes is None and settings.fallback_share > 0:
                outcomes = self._fallback_decide(checks, now_ms)
            if outcomes is None:
                mode = dom.failure_mode or settings.failure_mode
                overall = OK if mode == "allow" or settings.limiting_off else OVER_LIMIT
                self.metrics.count_request(domain, _CODE[overall])
                return Decision(overall, statuses)
            overall = self._report(checks, outcomes, statuses)
            if self._local_cache and overall == OVER_LIMIT:
                self._remember_over(checks, outcomes)
        if overall == OVER_LIMIT and (
            settings.shadow_mode or settings.limiting_off or domain in settings.shadow_domains
        ):
            if not settings.limiting_off:
                self.metrics.global_shadow.inc()
            overall = OK
        self.metrics.count_request(domain, _CODE[overall])
        decision = Decision(overall, statuses)
        if settings.dynamic_metadata:
            decision.metadata = _passed_metadata(dom, descriptors, statuses)
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
                targets = _targets(dom, domain, desc.entries, prefix)
                if len(memo) >= MEMO_MAX:
                    memo.clear()
                memo[desc.entries] = targets
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
                flags |= NEGATIVE
            bounds = None
            if limit.calendar:
                clock_ms = now_ms if now_ms is not None else int(time.time() * 1000)
                bounds = self._calendar.bounds(limit, clock_ms)
            checks.append(Check(i, limit, key, hits, flags, dyn, bounds))

        return checks

    def clear_local_cache(self) -> None:
        """Forget locally known over-limit keys (a config reload may change the limits)."""
        self._known_over.clear()

    def _remember_over(self, checks: list[Check], outcomes: list[Outcome]) -> None:
        now = _local_ms()
        known = self._known_over
        if len(known) > LOCAL_CACHE_MAX:
            known.clear()
        for check, out in zip(checks, outcomes, strict=True):
            if (
                not out.ok
                and not out.charged
                and not check.flags & _NOT_CACHEABLE
                and check.limit.algorithm not in _RELEASABLE
            ):
                known[check.key] = (now + out.reset_ms, max(check.hits, 1))

    def _answer_locally(self, checks: list[Check], statuses: list[Status]) -> bool:
        """Reject without a round trip when an enforcing check is known over until its reset.

        Only for requests that would charge nothing anyway (no releases, no `charge: always`).
        Descriptors that were not looked up are reported without current_limit.
        """
        now = _local_ms()
        known = self._known_over
        hit: tuple[Check, int] | None = None
        for check in checks:
            if check.flags & NEGATIVE:
                known.pop(check.key, None)  # a release makes room: ask the backend again
                return False
            if check.flags & CHARGE_ALWAYS:
                return False
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
            return False
        check, reset_ms = hit
        status = statuses[check.descriptor]
        status.code, status.limit, status.remaining, status.reset_ms = (
            OVER_LIMIT,
            check.limit,
            0,
            reset_ms,
        )
        self.metrics.local_cache_over.labels(check.limit.full_key).inc(check.hits)
        self.metrics.record_limit(
            check.limit, check.stats_key, check.hits, check.limit.requests_per_unit, True, False
        )
        return True

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
            merged, slots = _merge_same_counter(checks)
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

    def _fallback_decide(self, checks: list[Check], now_ms: int | None) -> list[Outcome]:
        """Decide locally on `fallback_share` of each limit while the backend is away.

        Bound: with N processes each granting share s, at most N * s * limit per window pass
        during an outage (s = 1/N keeps it near the limit); counts restart from zero locally.
        """
        self.metrics.fallback.inc()
        self._fallback_calls += 1
        if self._fallback_calls % 10000 == 0:
            self._fallback.sweep()
        local = [replace(c, limit=self._scaled(c.limit)) for c in checks]
        if len(local) > 1:
            local, slots = _merge_same_counter(local)
            if slots is not None:
                outcomes = self._fallback.decide_now(local, now_ms).outcomes
                return [outcomes[j] for j in slots]
        return self._fallback.decide_now(local, now_ms).outcomes

    def _scaled(self, limit: Limit) -> Limit:
        scaled = self._scaled_limits.get(id(limit))
        if scaled is None or scaled[0] is not limit:
            share = self.settings.fallback_share
            copy = replace(
                limit,
                requests_per_unit=math.ceil(limit.requests_per_unit * share),
                burst=None if limit.burst is None else math.ceil(limit.burst * share),
                overdraft=math.ceil(limit.overdraft * share),
                stats=None,
            )
            if len(self._scaled_limits) > 4096:
                self._scaled_limits.clear()
            scaled = self._scaled_limits[id(limit)] = (limit, copy)
        return scaled[1]

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


def _targets(
    dom: Domain, domain: str, entries: tuple[tuple[str, str], ...], prefix: str
) -> tuple[tuple[Limit, str, str | None, dict[str, Any] | None], ...]:
    """(limit, counter key, dynamic stats key, node metadata) for every limit matched."""
    path = match(dom, entries)
    if path is None:
        return ()
    parts = [
        (k, node.value if node.share_threshold else v)
        for node, (k, v) in zip(path, entries, strict=True)
    ]
    dyn = stats_key(domain, path, entries) if needs_dynamic_stats(path) else None
    meta = path[-1].metadata
    return tuple(
        (limit, counter_key(prefix, domain, parts, limit.ident), dyn, meta)
        for limit in path[-1].limits
    )


def _passed_metadata(
    dom: Domain, descriptors: Sequence[DescriptorIn], statuses: list[Status]
) -> list[dict[str, Any]]:
    """Config metadata of descriptors that passed and are limited (not unlimited), in order."""
    out = []
    for desc, status in zip(descriptors, statuses, strict=True):
        if status.code == OVER_LIMIT or status.remaining == UNLIMITED_REMAINING:
            continue
        targets = dom.memo.get(desc.entries)
        if targets and targets[0][3]:
            out.append(targets[0][3])
    return out


def _merge_same_counter(checks: list[Check]) -> tuple[list[Check], list[int] | None]:
    """Fold checks on the same counter (two descriptors of one request mapping to one key)
    into one check, so the counter is charged for both, as with the reference's two INCRBYs.

    Hits are netted: charges add, releases (is_negative_hits) subtract; a negative net is a
    release of that size. Returns (checks, None) when there is nothing to fold.
    """
    index: dict[str, int] = {}
    net: list[int] = []
    merged: list[Check] = []
    slots: list[int] = []
    for check in checks:
        signed = -check.hits if check.flags & NEGATIVE else check.hits
        j = index.get(check.key)
        if j is None:
            index[check.key] = len(merged)
            slots.append(len(merged))
            merged.append(check)
            net.append(signed)
        else:
            net[j] += signed
            slots.append(j)
    if len(merged) == len(checks):
        return checks, None
    for j, check in enumerate(merged):
        total = net[j]
        flags = check.flags | NEGATIVE if total < 0 else check.flags & ~NEGATIVE
        if total != (-check.hits if check.flags & NEGATIVE else check.hits):
            merged[j] = replace(check, hits=abs(total), flags=flags)
    return merged, slots


def _tighter(over: bool, remaining: int, reset_ms: int, current: Status) -> bool:
    """Whether a check should replace the one a descriptor currently reports."""
    if over:
        if current.code != OVER_LIMIT:
            return True
        return reset_ms > (current.reset_ms or 0)  # report when the caller is let in again
    return remaining < current.remaining


_UNITS = frozenset(int(u) for u in Unit)
LOCAL_CACHE_MAX = 100_000
MEMO_MAX = 10_000  # match results kept per domain; cleared whole when full
_NOT_CACHEABLE = SHADOW | QUOTA | NEGATIVE | CHARGE_ALWAYS
# Algorithms whose room comes back early through releases from any replica.
_RELEASABLE = frozenset({"concurrency"})


def _local_ms() -> int:
    return int(time.time() * 1000)


_CODE = {OK: "OK", OVER_LIMIT: "OVER_LIMIT"}
