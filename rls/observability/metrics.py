"""Prometheus metrics with bounded cardinality.

Per-limit series are labelled by the limit's config path (reference stats key), so their number
is bounded by the config; request values appear only where the config opts in with
`detailed_metric` / `value_to_metric`.

The hot path does not touch prometheus_client objects: per-limit and per-domain counts are
added to plain Python numbers (resolved once per limit and cached on the Limit) and pushed into
the Counters by `flush()` — on every collection (scrape, `get_sample_value`) and once a second
for the other workers in multiprocess mode. A counter lock and value lookup per increment cost
more than the rest of a decision.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from rls import __version__
from rls.core.limits import Limit
from rls.memo import publish_to
from rls.settings.environment import metrics_multiprocess

# Label values of the failure counters, each a closed set: their series are created at 0 up
# front (`prepare_domains` for the per-domain ones), so rate() counts the first burst of
# failures instead of starting from its first sample.
REQUEST_ERROR_REASONS = ("invalid_argument", "overloaded", "unavailable", "store_failed")
FAILURE_REASONS = ("store_down", "store_error", "store_slow", "overloaded")
# What answered a call the store did not decide: a failure mode (allow, deny, error: gRPC
# UNAVAILABLE) or the local fallback share.
FAILURE_ANSWERS = ("allow", "deny", "error", "fallback")
OVERLOAD_ANSWERS = ("unavailable", "resource_exhausted")  # reason overloaded only
CONFIG_LOAD_RESULTS = ("success", "error")
MAX_PREPARED_DOMAINS = 1000  # beyond: series appear on first use, as before

# envoyproxy/ratelimit's stat names: `:` and `|` (statsd separators) become `_`, and so do the
# dots of IPv4 addresses (dots split its statsd path into the mapper's `key1`, `key2` labels).
_STATSD_UNSAFE = str.maketrans({":": "_", "|": "_"})
_IPV4 = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}")


def stat_label(key: str) -> str:
    """A stats key as the reference emits it, for the per-limit `key` label: dashboards and
    rls.observability.reference_metrics split it on dots as the reference's mapper does, so an
    IP-valued detailed metric must stay one level. (The key itself, e.g. in dynamic metadata
    or the matcher, stays unescaped, as the reference's `Stats.Key` does.)"""
    return _IPV4.sub(lambda m: m.group().replace(".", "_"), key.translate(_STATSD_UNSAFE))


disable_created_metrics()  # type: ignore[no-untyped-call]  # halves the /metrics size; *_created series carry nothing useful here


class Pending:
    """Buffered increments for a fixed set of counter children."""

    __slots__ = ("children", "values")

    def __init__(self, children: tuple[Any, ...]) -> None:
        self.children = children
        self.values = [0.0] * len(children)


class FlushingRegistry(CollectorRegistry):
    """A registry that pushes buffered increments into its counters before every collection."""

    def __init__(self) -> None:
        super().__init__()
        self.before_collect: Any = None

    def collect(self) -> Any:
        if self.before_collect is not None:
            self.before_collect()
        return super().collect()


# Families computed from the collected ones at each scrape (rls.observability.reference_metrics).
Derivation = Callable[[Sequence[Metric]], list[Metric]]


class WithDerived:
    """A collector: `source`'s families, then what each derivation computes from them (one
    collection serves both)."""

    def __init__(self, source: Collector, derivations: Sequence[Derivation]) -> None:
        self.source = source
        self.derivations = derivations

    def collect(self) -> Iterable[Metric]:
        families = list(self.source.collect())
        return families + [m for derive in self.derivations for m in derive(families)]


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None, near_ratio: float = 0.8):
        r = registry if registry is not None else FlushingRegistry()
        if isinstance(r, FlushingRegistry):
            r.before_collect = self.flush
        self.registry = r
        if registry is None:  # the process's own memory and CPU (single process only)
            ProcessCollector(registry=r)
        # Families derived from the collected ones at each scrape (the reference's names).
        self.derived: list[Derivation] = []
        self._pending: list[Pending] = []
        self._dynamic: dict[str, Pending] = {}
        self._requests: dict[tuple[str, str], Pending] = {}
        self.near_ratio = near_ratio
        # Collectors read at scrape time under --workers, besides the workers' files (the
        # supervisor's worker slots: rls.process.workers.WorkersCollector, registered by the
        # server).
        self.process_collectors: list[Any] = []
        # One builder per area. /metrics shows the families in the order they register here:
        # add new ones at the end of their area, do not reorder (docs/metrics.md lists each).
        self._request_families(r)
        self._limit_families(r)
        self._store_families(r)
        self._process_families(r)
        self._engine_families(r)
        self._config_families(r)
        self._candidate_families(r)
        self._reservation_families(r)
        self._prepared: set[str] = set()
        for reason in REQUEST_ERROR_REASONS:
            self.errors.labels(reason)
        for result in CONFIG_LOAD_RESULTS:
            self.config_loads.labels(result)

    def prepare_domains(self, domains: Iterable[str]) -> None:
        """Create the per-domain failure series of configured domains at 0 (called on each
        successful config load; a domain's series stay after it is removed, as they would
        once used)."""
        for domain in domains:
            if domain in self._prepared or len(self._prepared) >= MAX_PREPARED_DOMAINS:
                continue
            self._prepared.add(domain)
            for reason in FAILURE_REASONS:
                for answer in FAILURE_ANSWERS:
                    self.failure_answers.labels(domain, reason, answer)
            for answer in OVERLOAD_ANSWERS:
                self.failure_answers.labels(domain, "overloaded", answer)

    def _request_families(self, r: CollectorRegistry) -> None:
        """ShouldRateLimit calls: how many, by answer, why rejected, how long deciding took."""
        self.requests = Counter(
            "rls_requests", "ShouldRateLimit calls by domain and overall code", ["domain", "code"],
            registry=r,
        )
        self.errors = Counter(
            "rls_request_errors", "Rejected or failed calls by reason", ["reason"], registry=r
        )
        self.domain_not_found = Counter(
            "rls_domain_not_found",
            "Descriptors for a domain that is not configured, by domain (the name when short "
            "and printable, for the first 100 names; then _other)",
            ["domain"],
            registry=r,
        )
        self.latency = Histogram(
            "rls_decision_seconds",
            "Time to decide one ShouldRateLimit call",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1),
            registry=r,
        )

    def _limit_families(self, r: CollectorRegistry) -> None:
        """Per limit (labelled by its stats key): hits within, near and over it, and what let
        over-limit hits through (shadow mode) or answered them without the store (local cache)."""
        labels = ["key"]
        self.total_hits = Counter("rls_limit_total_hits", "Hits per limit", labels, registry=r)
        self.within = Counter("rls_limit_within_limit", "Hits within limit", labels, registry=r)
        self.near = Counter("rls_limit_near_limit", "Hits near (80%) the limit", labels, registry=r)
        self.over = Counter("rls_limit_over_limit", "Hits over limit", labels, registry=r)
        self.shadow = Counter(
            "rls_limit_shadow_mode", "Over-limit hits let through by shadow mode", labels,
            registry=r,
        )
        self.local_cache_over = Counter(
            "rls_limit_over_limit_with_local_cache",
            "Over-limit hits answered from the local over-limit cache (no backend call)",
            labels,
            registry=r,
        )
        self.global_shadow = Counter(
            "rls_global_shadow_mode", "Calls turned OK by the global shadow switch", registry=r
        )

    def _store_families(self, r: CollectorRegistry) -> None:
        """The counter store: round trips, failures, the circuit breaker, and what answered the
        calls the store did not decide (failure modes)."""
        self.backend_calls = Counter(
            "rls_backend_roundtrips", "Round trips to the counter store", ["backend"], registry=r
        )
        self.backend_errors = Counter(
            "rls_backend_errors", "Failed or timed-out store calls", ["backend", "failure_mode"],
            registry=r,
        )
        self.circuit = Gauge(
            "rls_backend_circuit_open",
            "Backend circuit breaker: 0 closed, 1 open (a probe closes it)",
            ["backend"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.failure_answers = Counter(
            "rls_failure_mode_answers",
            "Calls the store did not decide, by domain, reason (store_down: breaker open; "
            "store_error; store_slow: the store used the whole budget; overloaded: rls itself "
            "could not decide in time) and what answered (allow, deny, error, fallback, "
            "unavailable)",
            ["domain", "reason", "answer"],
            registry=r,
        )
        self.memory_evictions = Counter(
            "rls_memory_evictions",
            "Live counters the memory store forgot at its byte bound (least recently used "
            "first; expired ones are not counted)",
            registry=r,
        )
        self.memory_bytes = Gauge(
            "rls_memory_store_bytes",
            "Estimated bytes of the memory store's counters (bound: --memory-max-bytes)",
            registry=r,
            multiprocess_mode="livesum",
        )

    def lease_counts(self, names: Sequence[str]) -> list[float]:
        """Buffered counts of the leased counters, in the order of `names`
        (rls.stores.redis.leases.COUNT_NAMES), flushed into rls_lease_<name>_total like the
        request counts."""
        texts = {
            "decisions": "Requests decided from leased tokens alone (no Redis call)",
            "refills": "Calls that took tokens from a Redis counter for a lease",
            "releases": "Calls that gave a lease's unused tokens back (idle, config change, "
            "drain)",
            "released_tokens": "Tokens given back to their Redis counters",
            "stranded_tokens": "Leased tokens not handed out when their window ended",
            "lost": "Leases whose Redis counter was lost (restart, flush, failover): what they "
            "held was dropped, not dealt",
        }
        children = tuple(
            Counter(f"rls_lease_{name}", texts[name], registry=self.registry)
            for name in names
        )
        return self._buffer(children).values

    def _process_families(self, r: CollectorRegistry) -> None:
        """The process: garbage-collector pauses and frozen objects, event-loop lag, and whether
        the store accepted rls (readiness)."""
        self.gc_pause = Histogram(
            "rls_gc_pause_seconds",
            "Garbage collection pauses of the event loop, by generation",
            ["generation"],
            buckets=(0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1),
            registry=r,
        )
        self.gc_frozen = Gauge(
            "rls_gc_frozen_objects",
            "Objects moved out of the garbage collector's walk after start-up and reloads",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.loop_lag = Histogram(
            "rls_event_loop_lag_seconds",
            "How late the event loop ran a 10 ms tick (time no waiting call could use)",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5),
            registry=r,
        )
        self.store_ready = Gauge(
            "rls_store_ready",
            "1 once the store accepted rls (connections open, scripts loaded), else 0",
            registry=r,
            multiprocess_mode="livemin",
        )

    def _engine_families(self, r: CollectorRegistry) -> None:
        """The engine besides deciding: releases it ignored, its bounded memos (published to the
        memo module), decisions of the local fallback limiter."""
        self.releases_ignored = Counter(
            "rls_releases_ignored",
            "is_negative_hits on limits that do not accept releases (ignored), by domain",
            ["domain"],
            registry=r,
        )
        self.memo_bytes = Gauge(
            "rls_memo_bytes", "Estimated bytes held by the bounded memos", ["memo"],
            registry=r, multiprocess_mode="livesum",
        )
        self.memo_entries = Gauge(
            "rls_memo_entries", "Entries held by the bounded memos", ["memo"],
            registry=r, multiprocess_mode="livesum",
        )
        for memo in ("request_parse", "match", "plan", "response_shape", "wildcard"):
            publish_to(memo, self.memo_bytes.labels(memo), self.memo_entries.labels(memo))
        self.fallback = Counter(
            "rls_fallback_decisions",
            "Calls decided by the local fallback limiter while the backend was away",
            registry=r,
        )

    def _config_families(self, r: CollectorRegistry) -> None:
        """Configuration and runtime state: (re)loads and the last load's error, runtime switches,
        build information."""
        self.config_loads = Counter(
            "rls_config_loads", "Config (re)loads by result", ["result"], registry=r
        )
        self.config_error = Gauge(
            "rls_config_last_load_error", "1 while the last load failed, by file", ["file"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.switch = Gauge(
            "rls_switch", "Runtime switches (1 on; shadow_domains: how many)", ["name"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.build = Gauge(
            "rls_build_info", "Build information", ["version"], registry=r,
            multiprocess_mode="livemax",
        )
        self.build.labels(__version__).set(1)

    def _candidate_families(self, r: CollectorRegistry) -> None:
        """Candidate limits (YAML `candidates:`): what each would have answered, never enforced.
        Labels come from the config (domain, the live limit's stats key, the candidate's name),
        so the series are bounded by it."""
        labels = ["domain", "limit", "candidate"]
        self.candidate_checks = Counter(
            "rls_candidate_checks", "Decisions a candidate limit was counted in", labels,
            registry=r,
        )
        self.candidate_over = Counter(
            "rls_candidate_over_limit",
            "Decisions a candidate limit would have answered OVER_LIMIT", labels, registry=r,
        )
        self.candidate_near = Counter(
            "rls_candidate_near_limit",
            "Decisions within a candidate limit but past its near-limit ratio", labels,
            registry=r,
        )
        self._candidates: dict[tuple[str, str, str], Pending] = {}

    def _reservation_families(self, r: CollectorRegistry) -> None:
        """`reserve:` limits (docs/token-budgets.md): reservations held until their stream-end
        settle, and how each one ended."""
        self.reservations_open = Gauge(
            "rls_reservations_open",
            "Reservations waiting for their settle (as of the store's last answer; Redis: all "
            "replicas' reservations)",
            registry=r, multiprocess_mode="livemax",
        )
        self.reservations_bytes = Gauge(
            "rls_reservations_bytes",
            "Estimated bytes of the reservation records, open and settled (bound: a quarter "
            "of --memory-max-bytes)",
            registry=r, multiprocess_mode="livemax",
        )
        self.reservations_settled = Counter(
            "rls_reservations_settled",
            "Reservations settled by their stream-end call (the difference charged or released)",
            registry=r,
        )
        self.reservations_expired = Counter(
            "rls_reservations_expired",
            "Reservations dropped unsettled at their expire_after, their estimate kept charged",
            registry=r,
        )
        self.settles_unreserved = Counter(
            "rls_settles_without_reservation",
            "Stream-end settles that found no reservation (charged the actual cost as a plain "
            "cost)",
            registry=r,
        )
        self.reservations_unrecorded = Counter(
            "rls_reservations_unrecorded",
            "Admitted reservations not recorded (the byte bound, or the store failed): their "
            "estimate stays charged and their settle charges the actual cost on top",
            registry=r,
        )

    def watch_reservations(self, store: Any) -> None:
        """The open and byte gauges read `store` (open_count, nbytes) at each scrape."""
        self.reservations_open.set_function(lambda: store.open_count)
        self.reservations_bytes.set_function(lambda: store.nbytes)

    def record_candidate(self, domain: str, limit: Limit, over: bool, near: bool) -> None:
        """One decision a candidate limit was counted in, and what it would have answered."""
        self.record_candidate_counts(domain, limit, 1, int(over), int(near and not over))

    def record_candidate_counts(
        self, domain: str, limit: Limit, checks: int, over: int, near: int
    ) -> None:
        """`checks` decisions a candidate limit was counted in at once (a quota report), `over`
        of them would-be over-limit and `near` past its near-limit ratio."""
        key = (domain, limit.full_key, limit.candidate)
        pending = self._candidates.get(key)
        if pending is None:
            if len(self._candidates) > 10_000:  # labels come from the config; stay bounded
                return
            pending = self._candidates[key] = self._buffer(
                (
                    self.candidate_checks.labels(*key),
                    self.candidate_over.labels(*key),
                    self.candidate_near.labels(*key),
                )
            )
        values = pending.values
        values[0] += checks
        values[1] += over
        values[2] += near

    def flush(self) -> None:
        for pending in self._pending:
            values = pending.values
            for i, value in enumerate(values):
                if value:
                    pending.children[i].inc(value)
                    values[i] = 0.0

    def count_request(self, domain: str, code: str) -> None:
        pending = self._requests.get((domain, code))
        if pending is None:
            if len(self._requests) > 10_000:  # domains come from the config; stay bounded
                domain = "_other"
                pending = self._requests.get((domain, code))
            if pending is None:
                pending = self._buffer((self.requests.labels(domain, code),))
                self._requests[(domain, code)] = pending
        pending.values[0] += 1

    def count_failure_answer(self, domain: str, reason: str, answer: str) -> None:
        if len(self._requests) > 10_000:  # domains come from the config; stay bounded
            domain = "_other"
        self.failure_answers.labels(domain, reason, answer).inc()

    def _buffer(self, children: tuple[Any, ...]) -> Pending:
        pending = Pending(children)
        self._pending.append(pending)
        return pending

    def exposition(self) -> bytes:
        """Prometheus text for /metrics: summed over all workers in multiprocess mode."""
        self.flush()
        source: Collector = self.registry
        if metrics_multiprocess():
            merged = CollectorRegistry()
            multiprocess.MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
            for collector in self.process_collectors:
                merged.register(collector)
            source = merged
        if self.derived:
            source = WithDerived(source, self.derived)
        return generate_latest(source)

    def limit_stats(self, limit: Limit, key: str | None = None) -> Pending:
        """The buffered counters of one stats key (the limit's config path by default).

        Kept here by key, not on the Limit: config objects carry no runtime state, and a
        reloaded config with the same paths reuses the same buffers (no growth per reload)."""
        if key is None:
            key = limit.full_key
        found = self._dynamic.get(key)
        if found is not None:
            return found
        label = stat_label(key)
        pending = self._buffer(
            (
                self.total_hits.labels(label),
                self.within.labels(label),
                self.near.labels(label),
                self.over.labels(label),
                self.shadow.labels(label),
            )
        )
        self._dynamic[key] = pending
        return pending

    def count_local_cache_over(self, limit: Limit, key: str | None, hits: int) -> None:
        """An over-limit answer from the local cache, under the same `key` label as the
        limit's other counters (the detailed key with detailed_metric, as the reference)."""
        self.local_cache_over.labels(stat_label(key or limit.full_key)).inc(hits)

    def record_limit(
        self, limit: Limit, key: str | None, hits: int, used: int, over: bool, shadow: bool
    ) -> None:
        """The reference's split of a (possibly weighted) hit into within / near / over."""
        found = self._dynamic.get(limit.full_key if key is None else key)  # limit_stats, inline
        values = (found or self.limit_stats(limit, key)).values  # total, within, near, over, shadow
        values[0] += hits
        if hits <= 0:
            return
        cap = limit.requests_per_unit
        near_at = int(cap * self.near_ratio)
        after = used + hits
        if not over:
            values[1] += hits
            if after > near_at:
                values[2] += min(hits, after - near_at)
            return
        if used < cap < after:  # the hit crossed the limit: split it as the reference does
            excess = after - cap
            values[2] += cap - max(near_at, used)
        else:
            excess = hits
        values[3] += excess
        if shadow:
            values[4] += excess
