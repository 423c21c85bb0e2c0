"""ShouldRateLimit decisions: match descriptors, build checks, ask the backend once, report.

The service layer hands in plain values (no protobuf), so the same path serves gRPC, the admin
`/json` endpoint and tests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from rls.config.model import Domain, Limit, RateLimitConfig
from rls.core.keys import counter_key
from rls.core.model import CHARGE_ALWAYS, NEGATIVE, QUOTA, SHADOW, Check, Outcome
from rls.core.usage import UsageOp, usage_ops
from rls.engine.calendar import CalendarCache
from rls.engine.candidates import split_candidates, with_candidates
from rls.engine.checks import match_cost, match_targets, merge_same_counter, passed_metadata
from rls.engine.decision import (
    OK,
    OVER_LIMIT,
    UNLIMITED_REMAINING,
    Decision,
    DescriptorIn,
    InvalidRequest,
    NoConfigLoaded,
    Overloaded,
    Status,
    StoreFailed,
)
from rls.engine.decision_log import DecisionLog
from rls.engine.fallback import FallbackLimiter
from rls.engine.outcomes import OverrideLimits, fold_outcomes
from rls.engine.over_limit_cache import OverLimitCache
from rls.engine.reservations import SWEEP_INTERVAL_S, Reservations, Tag, split
from rls.engine.rules import COUNTED, UNLIMITED, domain_shadowed, failure_mode, limit_role
from rls.engine.top import NEAR, OVER, TopTalkers
from rls.engine.unknown_domains import UnknownDomains
from rls.memo import (
    MATCH_MEMO_BYTES,
    MATCH_MEMO_ENTRIES,
    PLAN_BYTES,
    PLAN_CHECK_BYTES,
    PLAN_ENTRIES,
    BoundedCache,
)
from rls.observability.logs import LogGate
from rls.observability.metrics import Metrics
from rls.settings import Settings
from rls.stores.base import Backend, BackendError
from rls.stores.calls import STORE_ERROR, Decide, StoreCalls
from rls.stores.deadline import OVERLOADED, LoopLag
from rls.stores.reservations import Opening, reservations_for

log = logging.getLogger("rls.limiter")

# (checks, now_ms, usage, usage_ttl_ms, budget_s) -> outcomes, or None and why (tracing wraps it)
StoreCall = Decide

# The limiter's interface: RateLimiter with the values it takes and returns (defined in
# rls.engine.decision, which the limiter's own parts import without importing the limiter).
__all__ = [
    "OK", "OVER_LIMIT", "UNLIMITED_REMAINING", "Decision", "DescriptorIn", "InvalidRequest",
    "NoConfigLoaded", "Overloaded", "RateLimiter", "Status", "StoreCall", "StoreFailed",
]


class RateLimiter:
    def __init__(
        self,
        config: Callable[[], RateLimitConfig | None],
        backend: Backend,
        settings: Settings,
        metrics: Metrics,
        lag: LoopLag | None = None,
    ) -> None:
        self._config = config
        self.lag = lag if lag is not None else LoopLag()
        self.backend = backend
        self.settings = settings
        self.metrics = metrics
        self._overrides = OverrideLimits()
        self._calendar = CalendarCache()
        self._backend_errors = metrics.backend_errors.labels(backend.name, settings.failure_mode)
        self._failure_log = LogGate(per_second=1)
        # Every store call, under one policy (deadline, probe, breaker, what a failure means).
        self.store = StoreCalls(
            backend, self.lag, settings.backend_timeout_ms, settings.overload_cap_ms,
            failed=self._store_failed, sent=metrics.backend_calls.labels(backend.name).inc,
        )
        self.call_store: StoreCall = self.store.decide  # tracing wraps it at start
        # In-process answers for keys known over limit (a store behind a round trip only).
        self._over_cache = (
            OverLimitCache(metrics) if self.store.round_trip and settings.local_cache else None
        )
        self._fallback = FallbackLimiter(settings.fallback_share, metrics)
        self._memo_config: RateLimitConfig | None = None
        self._memos: dict[str, BoundedCache] = {}
        # Request shapes' checks under the current config (_planned_checks), by descriptors.
        self._plans = BoundedCache("plan", PLAN_ENTRIES, PLAN_BYTES)
        self._unknown_domains = UnknownDomains(metrics.domain_not_found)
        self.top = TopTalkers()  # who is over / near their limits (admin /top, `rls top`)
        self._near_ratio = settings.near_limit_ratio
        # `--decision-log`: a sampled line per decision for `rls replay`, written off the loop.
        self.decisions = (
            DecisionLog(settings.decision_log, settings.decision_log_sample,
                        settings.decision_log_max_bytes)
            if settings.decision_log else None
        )
        # `reserve:` reservations, in the counters' store (a quarter of the memory bound).
        self.reservations = Reservations(
            reservations_for(
                backend, settings.key_prefix, settings.memory_max_bytes // 4,
                metrics.reservations_expired.inc,
                max(settings.backend_timeout_ms, 1000) / 1000,
            ),
            metrics,
        )
        metrics.watch_reservations(self.reservations.store)

    async def should_rate_limit(
        self,
        domain: str,
        descriptors: Sequence[DescriptorIn],
        request_hits: int = 0,
        now_ms: int | None = None,
        budget_s: float | None = None,
        repeat: bool = True,
    ) -> Decision:
        """Decide one request. `budget_s`: the caller's own time left (its gRPC deadline less a
        margin); None uses --backend-timeout-ms. `repeat`: the same request was seen before
        (the service's parse memo handed these descriptors again), so its shape is worth a
        plan; a request seen once (a new caller, a unique key) is decided without one."""
        config = self._config()
        if config is None:
            raise NoConfigLoaded("no rate limit configuration loaded")
        statuses = [Status() for _ in descriptors]
        dom = config.domains.get(domain)
        if dom is None:
            self._unknown_domains.report(domain, len(descriptors), config.domains)
            self.metrics.count_request("_unknown", "OK")
            if self.decisions is not None:  # a decision too: a config adding it replays it
                self.decisions.record(domain, descriptors, request_hits, "OK", now_ms)
            return Decision(OK, statuses)

        memo = self._memos.get(domain) if config is self._memo_config else None
        if memo is None:
            memo = self._memo(config, domain)
        logged = descriptors  # the decision log keeps the call as it came (replay)
        openings: list[Opening] = []
        split_up = split(dom, descriptors) if dom.reserve_ids else None
        if split_up is not None:
            descriptors = split_up[0]
            reserved = await self._reserve_checks(
                dom, domain, split_up, request_hits, now_ms, statuses, memo
            )
            if isinstance(reserved, Decision):
                return reserved
            checks, openings = reserved
        elif repeat:
            checks = self._planned_checks(
                dom, domain, descriptors, request_hits, now_ms, statuses, memo
            )
        else:
            checks, _ = self._checks(
                dom, domain, descriptors, request_hits, now_ms, statuses, memo
            )
        usage = self._usage(dom, domain, descriptors, now_ms) if dom.usage is not None else []
        over_cache = self._over_cache
        cands = 0  # candidate checks at the end of `checks` (rls/core/admission.py)
        if dom.has_candidates and checks:
            checks, cands = with_candidates(checks, self._calendar, now_ms)
            if cands:
                over_cache = None  # the store counts candidates on every call
        hit = over_cache.answer(checks, statuses) if checks and over_cache else None
        if usage and (hit is not None or not checks):
            # Every call counts in usage, also those decided without the decision round trip.
            await self._record_usage_alone(usage, dom.usage.ttl_ms, now_ms)
        overall = OK
        if hit is not None:
            overall = OVER_LIMIT
            others = [c for c in checks if c is not hit]
            if others:
                await self._report_uncharged(others, now_ms, statuses)
        elif checks:
            decided = await self._decide_checks(
                dom, domain, descriptors, checks, cands, usage, statuses, now_ms, budget_s,
                over_cache,
            )
            if isinstance(decided, Decision):  # the store could not decide: the failure mode
                return decided
            overall = decided
        if openings and overall == OK:  # admitted: its estimates are charged, held until settled
            await self.reservations.record(openings, now_ms)
        return self._answer(
            domain, descriptors, request_hits, now_ms, statuses, overall, memo, logged
        )

    async def _reserve_checks(
        self,
        dom: Domain,
        domain: str,
        split_up: tuple[list[DescriptorIn], list[Tag]],
        request_hits: int,
        now_ms: int | None,
        statuses: list[Status],
        memo: BoundedCache,
    ) -> tuple[list[Check], list[Opening]] | Decision:
        """The checks of a request with `reserve:` entries (rls.engine.reservations; never
        planned: every request id differs): a settle's, or a reservation's with the openings
        to record once admitted. The failure mode's answer when a settle could not take its
        reservations."""
        descriptors, tags = split_up
        checks, _ = self._checks(dom, domain, descriptors, request_hits, now_ms, statuses, memo)
        if not any(tag.settle for tag in tags):
            return checks, self.reservations.reserving(checks, tags, now_ms)
        try:
            return await self.reservations.settling(checks, tags, now_ms), []
        except (BackendError, TimeoutError) as exc:
            self._store_failed(exc)
            return self._failure_answer(dom, domain, checks, statuses, STORE_ERROR)

    async def _decide_checks(
        self,
        dom: Domain,
        domain: str,
        descriptors: Sequence[DescriptorIn],
        checks: list[Check],
        cands: int,
        usage: list[UsageOp],
        statuses: list[Status],
        now_ms: int | None,
        budget_s: float | None,
        over_cache: OverLimitCache | None,
    ) -> int | Decision:
        """The store call and its verdict folded into `statuses`: the overall code, or the
        failure mode's answer when neither the store nor the fallback share could decide."""
        outcomes, failure = await self._decide(checks, now_ms, usage, dom, budget_s)
        if failure == OVERLOADED:  # our own lag, not the store's: Envoy's failure mode decides
            self.metrics.count_failure_answer(domain, OVERLOADED, "unavailable")
            raise Overloaded(
                f"rls overloaded: no decision within {self.settings.overload_cap_ms} ms"
            )
        from_backend = outcomes is not None
        if cands:
            checks, outcomes = split_candidates(
                self.metrics, self.top, self._near_ratio, domain, descriptors, checks,
                outcomes, cands,
            )
        if outcomes is None and self.settings.fallback_share > 0:
            outcomes = self._fallback.decide(checks, now_ms)
            if outcomes is not None:
                self.metrics.count_failure_answer(domain, failure, "fallback")
        if outcomes is None:
            return self._failure_answer(dom, domain, checks, statuses, failure)
        overall = fold_outcomes(self.metrics, checks, outcomes, statuses)
        if over_cache is not None and overall == OVER_LIMIT and from_backend:
            over_cache.remember(checks, outcomes)  # never a fallback (local-share) verdict
        return overall

    def _usage(
        self, dom: Domain, domain: str, descriptors: Sequence[DescriptorIn], now_ms: int | None
    ) -> list[UsageOp]:
        """The domain's usage statistics writes for this request (none without `usage_stats`)."""
        if dom.usage is None:
            return []
        clock_ms = now_ms if now_ms is not None else int(time.time() * 1000)
        return usage_ops(
            dom.usage, self.settings.key_prefix, domain, [d.entries for d in descriptors],
            clock_ms, dom.key_hash,
        )

    def _answer(
        self,
        domain: str,
        descriptors: Sequence[DescriptorIn],
        request_hits: int,
        now_ms: int | None,
        statuses: list[Status],
        overall: int,
        memo: BoundedCache,
        logged: Sequence[DescriptorIn] | None = None,
    ) -> Decision:
        """A decided request's answer: top talkers fed, the domain's shadow switch applied
        (rls.engine.rules), counted, logged for replay (`logged`: the descriptors as they came,
        when reserve entries were taken out), metadata attached."""
        settings = self.settings
        self._record_top(domain, descriptors, statuses, request_hits)
        if overall == OVER_LIMIT and domain_shadowed(settings, domain):
            if not settings.limiting_off:
                self.metrics.global_shadow.inc()
            overall = OK
        self.metrics.count_request(domain, _CODE[overall])
        if self.decisions is not None:
            self.decisions.record(
                domain, descriptors if logged is None else logged, request_hits,
                _CODE[overall], now_ms,
            )
        decision = Decision(overall, statuses)
        if settings.dynamic_metadata:
            decision.metadata = passed_metadata(memo, descriptors, statuses)
        return decision

    def _planned_checks(
        self,
        dom: Domain,
        domain: str,
        descriptors: Sequence[DescriptorIn],
        request_hits: int,
        now_ms: int | None,
        statuses: list[Status],
        memo: BoundedCache,
    ) -> list[Check]:
        """`_checks` of a request shape seen before under this config, from its plan.

        Envoy sends byte-identical requests for the same caller and route, and the service's
        parse memo hands the same descriptors object for them: the checks (matched limits,
        counter keys, hits, flags), the unlimited descriptors and the ignored releases are
        worked out once per shape and config. Not planned: calendar windows (their bounds
        depend on the time). The checks are shared between calls and never changed."""
        plans = self._plans
        found = plans.get(id(descriptors))
        if (
            found is not None and found[0] is descriptors and found[1] == request_hits
            and found[2] == domain
        ):
            _, _, _, planned, unlimited, ignored = found
            for i in unlimited:
                statuses[i].remaining = UNLIMITED_REMAINING
            if ignored:
                self.metrics.releases_ignored.labels(domain).inc(ignored)
            return list(planned)
        checks, ignored = self._checks(
            dom, domain, descriptors, request_hits, now_ms, statuses, memo
        )
        if all(check.bounds is None for check in checks):
            unlimited = tuple(
                i for i, st in enumerate(statuses) if st.remaining == UNLIMITED_REMAINING
            )
            plans.put(
                id(descriptors),
                (descriptors, request_hits, domain, tuple(checks), unlimited, ignored),
                PLAN_CHECK_BYTES * (len(checks) + 1),
            )
        return checks

    def _checks(
        self,
        dom: Domain,
        domain: str,
        descriptors: Sequence[DescriptorIn],
        request_hits: int,
        now_ms: int | None,
        statuses: list[Status],
        memo: BoundedCache,
    ) -> tuple[list[Check], int]:
        """Match every descriptor and turn each limit that applies (rls.engine.rules) into a
        Check; unlimited ones are answered here (remaining 2^32-1). Also: how many releases
        were ignored (counted here)."""
        settings = self.settings
        default_hits = request_hits if request_hits > 0 else 1
        # (descriptor, limit, key, dynamic metadata, hits, release, an explicit cost)
        matched: list[tuple[int, Limit, str, str | None, int, bool, bool]] = []
        replaced: set[str] = set()
        prefix = settings.key_prefix
        for i, desc in enumerate(descriptors):
            hits = default_hits if desc.hits is None else desc.hits
            cost = desc.hits is not None and desc.hits > 0  # Envoy's per-descriptor hits_addend
            if desc.override is not None:
                limit = self._overrides.limit(domain, desc)
                key = counter_key(prefix, domain, desc.entries, limit.ident, dom.key_hash)
                matched.append((i, limit, key, None, hits, desc.negative, cost))
                continue
            targets = memo.get(desc.entries)
            if targets is None:
                targets = match_targets(dom, domain, desc.entries, prefix)
                memo.put(desc.entries, targets, match_cost(desc.entries, targets))
            for limit, key, dyn, _ in targets:
                if limit.replaces:
                    replaced.update(limit.replaces)
                matched.append((i, limit, key, dyn, hits, desc.negative, cost))

        checks: list[Check] = []
        ignored = 0
        for i, limit, key, dyn, hits, negative, cost in matched:
            role = limit_role(limit, replaced)
            if role != COUNTED:
                if role == UNLIMITED:
                    statuses[i].remaining = UNLIMITED_REMAINING
                continue
            flags = 0
            if limit.shadow_mode:
                flags |= SHADOW
            if limit.quota_mode or settings.quota_mode:
                flags |= QUOTA
            if limit.charge_always or (cost and not limit.costs_on_allow):
                flags |= CHARGE_ALWAYS  # see Limit.charge_always
            if negative:
                if not limit.accept_releases:  # see Limit.accept_releases
                    self.metrics.releases_ignored.labels(domain).inc()
                    ignored += 1
                    continue
                flags |= NEGATIVE
            bounds = None
            if limit.calendar:
                clock_ms = now_ms if now_ms is not None else int(time.time() * 1000)
                bounds = self._calendar.bounds(limit, clock_ms)
            checks.append(Check(i, limit, key, hits, flags, dyn, bounds))
        return checks, ignored

    def _memo(self, config: RateLimitConfig, domain: str) -> BoundedCache:
        """This config's match memo of `domain` (entries -> matched limits and counter keys).

        Runtime state kept here, not on the config: a new config object starts new memos, so a
        memo never serves results computed from another config."""
        if config is not self._memo_config:
            self._memo_config = config
            self._memos = {}
            self._plans.clear()
        memo = self._memos.get(domain)
        if memo is None:
            memo = self._memos[domain] = BoundedCache(
                "match", MATCH_MEMO_ENTRIES, MATCH_MEMO_BYTES
            )
        return memo

    def _record_top(
        self,
        domain: str,
        descriptors: Sequence[DescriptorIn],
        statuses: list[Status],
        request_hits: int,
    ) -> None:
        """Feed the top-talkers sketch with descriptors over or near their limit (only those:
        a call well within its limits costs one comparison per descriptor)."""
        for desc, status in zip(descriptors, statuses, strict=True):
            limit = status.limit
            if limit is None:
                continue
            if status.code == OVER_LIMIT:
                kind = OVER
            elif limit.requests_per_unit - status.remaining > int(
                limit.requests_per_unit * self._near_ratio
            ):  # the reference's near_limit: past 80 % of the limit after this call
                kind = NEAR
            else:
                continue
            hits = desc.hits if desc.hits is not None else request_hits
            self.top.record(domain, desc.entries, kind, hits)

    def _failure_answer(
        self,
        dom: Domain,
        domain: str,
        checks: list[Check],
        statuses: list[Status],
        reason: str,
    ) -> Decision:
        """The store could not decide: the domain's failure mode answers, and says so.

        In deny mode every limited descriptor shows OVER_LIMIT (not a misleading OK); in error
        mode the call fails (StoreFailed: UNAVAILABLE) and the caller's own failure mode
        decides."""
        mode = failure_mode(self.settings, dom)
        self.metrics.count_failure_answer(domain, reason, mode)
        if mode == "error":
            raise StoreFailed(f"the counter store could not decide ({reason})")
        allow = mode == "allow"
        overall = OK if allow else OVER_LIMIT
        if not allow:
            for check in checks:
                if not check.flags & (SHADOW | NEGATIVE):
                    statuses[check.descriptor].code = OVER_LIMIT
        self.metrics.count_request(domain, _CODE[overall])
        return Decision(overall, statuses)

    async def _report_uncharged(
        self, checks: list[Check], now_ms: int | None, statuses: list[Status]
    ) -> None:
        """The other descriptors of a request the local over-limit cache rejected: their
        current state (nothing is charged: the request is rejected) and their stats, as the
        reference reports them. A store failure leaves them without current_limit."""
        checks = [replace(check, flags=check.flags & (SHADOW | QUOTA)) for check in checks]
        try:
            verdict = await self.store.peek(checks, now_ms)
        except (BackendError, TimeoutError):
            return  # counted and logged by _store_failed
        fold_outcomes(self.metrics, checks, verdict.outcomes, statuses)

    def clear_local_cache(self) -> None:
        """Forget locally known over-limit keys and give leased tokens back (a config reload
        may change the limits)."""
        if self._over_cache is not None:
            self._over_cache.clear()
        self.store.config_changed()

    async def query(
        self, domain: str, descriptors: Sequence[DescriptorIn], now_ms: int | None = None
    ) -> list[list[tuple[Limit, Outcome]]]:
        """Per descriptor, each matched limit with its current usage — nothing is charged."""
        config = self._config()
        if config is None:
            raise NoConfigLoaded("no rate limit configuration loaded")
        dom = config.domains.get(domain)
        result: list[list[tuple[Limit, Outcome]]] = [[] for _ in descriptors]
        if dom is None:
            return result
        statuses = [Status() for _ in descriptors]
        checks, _ = self._checks(
            dom, domain, descriptors, 0, now_ms, statuses, self._memo(config, domain)
        )
        for check in checks:
            check.hits = 0
            check.flags &= SHADOW | QUOTA
        if not checks:
            return result
        budget = max(self.settings.backend_timeout_ms, 1000) / 1000
        verdict = await self.store.peek(checks, now_ms, budget)
        for check, out in zip(checks, verdict.outcomes, strict=True):
            result[check.descriptor].append((check.limit, out))
        return result

    async def _record_usage_alone(
        self, usage: list[UsageOp], ttl_ms: int, now_ms: int | None
    ) -> None:
        """Usage of a request that matched no limit: recorded, failures only counted."""
        try:
            await self.store.record_usage(usage, ttl_ms, now_ms)
        except (BackendError, TimeoutError):
            pass  # counted and logged by _store_failed

    async def _decide(
        self,
        checks: list[Check],
        now_ms: int | None,
        usage: list[UsageOp] | None = None,
        dom: Domain | None = None,
        budget_s: float | None = None,
    ) -> tuple[list[Outcome] | None, str]:
        """Outcomes per check, or (None, why the store could not decide)."""
        ttl = dom.usage.ttl_ms if usage and dom is not None and dom.usage is not None else 0
        usage = usage or []
        if len(checks) > 1 and len({c.key for c in checks}) < len(checks):
            merged, slots = merge_same_counter(checks)
            if slots is not None:
                outcomes, why = await self.call_store(merged, now_ms, usage, ttl, budget_s)
                return (None if outcomes is None else [outcomes[j] for j in slots]), why
        return await self.call_store(checks, now_ms, usage, ttl, budget_s)

    async def sweep_reservations(self, interval_s: float = SWEEP_INTERVAL_S) -> None:
        """Drop expired reservations every `interval_s` while the config declares `reserve:`
        (rls.stores.reservations); a failed sweep waits for the next."""
        seen: RateLimitConfig | None = None
        reserves = False
        while True:
            await asyncio.sleep(interval_s)
            config = self._config()
            if config is not seen:  # looked up once per loaded config
                seen = config
                reserves = config is not None and any(
                    d.reserve_ids for d in config.domains.values()
                )
            if not reserves:
                continue
            try:
                await self.reservations.store.sweep()
            except (BackendError, TimeoutError) as exc:
                self._store_failed(exc)

    def _store_failed(self, exc: Exception) -> None:
        """A store call failed (StoreCalls tells): counted, and logged at most once a second."""
        self._backend_errors.inc()
        self._log_failure(exc)

    def _log_failure(self, exc: Exception) -> None:
        """At most one line per second, so a dead store cannot fill the disk."""
        if self._failure_log.allow():
            log.warning(
                "backend %s failed (%d call(s) since last report): %s",
                self.backend.name,
                self._failure_log.take_suppressed() + 1,
                str(exc) or type(exc).__name__,
            )


_CODE = {OK: "OK", OVER_LIMIT: "OVER_LIMIT"}
