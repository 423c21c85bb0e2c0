"""Prometheus metrics with bounded cardinality.

Per-limit series are labelled by the limit's config path (reference stats key), so their number
is bounded by the config; request values appear only where the config opts in with
`detailed_metric` / `value_to_metric`. Label children are resolved once per limit and cached on
the Limit object, keeping the hot path free of label lookups.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from rls import __version__
from rls.config.model import Limit

disable_created_metrics()  # halves the /metrics size; *_created series carry nothing useful here


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None, near_ratio: float = 0.8):
        r = registry if registry is not None else CollectorRegistry()
        self.registry = r
        self.near_ratio = near_ratio
        self.requests = Counter(
            "rls_requests", "ShouldRateLimit calls by domain and overall code", ["domain", "code"],
            registry=r,
        )
        self.errors = Counter(
            "rls_request_errors", "Rejected or failed calls by reason", ["reason"], registry=r
        )
        self.domain_not_found = Counter(
            "rls_domain_not_found", "Descriptors for a domain that is not configured", registry=r
        )
        self.latency = Histogram(
            "rls_decision_seconds",
            "Time to decide one ShouldRateLimit call",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1),
            registry=r,
        )
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
        self.backend_calls = Counter(
            "rls_backend_roundtrips", "Round trips to the counter store", ["backend"], registry=r
        )
        self.backend_errors = Counter(
            "rls_backend_errors", "Failed or timed-out store calls", ["backend", "failure_mode"],
            registry=r,
        )
        self.circuit = Gauge(
            "rls_backend_circuit_open",
            "Backend circuit breaker: 0 closed, 1 open, 0.5 half-open (probing)",
            ["backend"],
            registry=r,
            multiprocess_mode="max",
        )
        self.fallback = Counter(
            "rls_fallback_decisions",
            "Calls decided by the local fallback limiter while the backend was away",
            registry=r,
        )
        self.config_loads = Counter(
            "rls_config_loads", "Config (re)loads by result", ["result"], registry=r
        )
        self.config_error = Gauge(
            "rls_config_last_load_error", "1 while the last load failed, by file", ["file"],
            registry=r,
            multiprocess_mode="max",
        )
        self.switch = Gauge(
            "rls_switch", "Runtime switches (1 on; shadow_domains: how many)", ["name"],
            registry=r,
            multiprocess_mode="max",
        )
        self.build = Gauge(
            "rls_build_info", "Build information", ["version"], registry=r,
            multiprocess_mode="max",
        )
        self.build.labels(__version__).set(1)

    def exposition(self) -> bytes:
        """Prometheus text for /metrics: summed over all workers in multiprocess mode."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)

    def limit_stats(self, limit: Limit, key: str | None = None) -> tuple:
        if key is None:
            cached = limit.stats
            if cached is not None and cached[0] is self:
                return cached[1]
            key = limit.full_key
        stats = (
            self.total_hits.labels(key),
            self.within.labels(key),
            self.near.labels(key),
            self.over.labels(key),
            self.shadow.labels(key),
        )
        if key == limit.full_key:
            limit.stats = (self, stats)  # per Metrics instance (tests build several)
        return stats

    def record_limit(
        self, limit: Limit, key: str | None, hits: int, used: int, over: bool, shadow: bool
    ) -> None:
        """The reference's split of a (possibly weighted) hit into within / near / over."""
        total, within, near, over_c, shadow_c = self.limit_stats(limit, key)
        total.inc(hits)
        if hits <= 0:
            return
        cap = limit.requests_per_unit
        near_at = int(cap * self.near_ratio)
        after = used + hits
        if not over:
            within.inc(hits)
            if after > near_at:
                near.inc(min(hits, after - near_at))
            return
        if used < cap < after:  # the hit crossed the limit: split it as the reference does
            excess = after - cap
            near.inc(cap - max(near_at, used))
        else:
            excess = hits
        over_c.inc(excess)
        if shadow:
            shadow_c.inc(excess)
