"""Prometheus metrics of the response cache (`rls_cache_*`), on a registry passed in.

Labels are bounded: `api` comes from the rules file, `reason` and `op` from fixed sets in the
code; request values never become labels.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

BYPASS_REASONS = (
    "no_rule",  # no rule selects the request's API
    "method",  # the API has a rule, the method is not listed
    "request_no_store",  # request Cache-Control: no-store
    "request_no_cache",  # request Cache-Control: no-cache: lookup skipped, the response stored
    "partial_request_body",  # the request body did not arrive whole
    "store_error",  # lookup failed or timed out: the request went upstream uncached
    "store_down",  # the store is marked down after repeated errors; not even tried
    "status",
    "no_store",
    "private",
    "no_cache",
    "set_cookie",
    "vary",
    "too_large",  # Content-Length or buffered body over max_entry_bytes
    "unknown_length",  # no Content-Length and the rule does not buffer such bodies
    "partial_body",  # response_body with end_of_stream false
)
ERROR_OPS = ("version", "get", "set", "expire", "purge", "decode")


class CacheMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.registry = r
        self.hits = Counter(
            "rls_cache_hits", "Requests answered from the cache", ["api"], registry=r
        )
        self.misses = Counter(
            "rls_cache_misses", "Cacheable requests sent upstream (not in the cache)", ["api"],
            registry=r,
        )
        self.stores = Counter("rls_cache_stores", "Responses written to the store", ["api"],
                              registry=r)
        self.stored_bytes = Counter(
            "rls_cache_stored_bytes", "Bytes of entries written to the store", ["api"], registry=r
        )
        self.bypasses = Counter(
            "rls_cache_bypasses", "Requests or responses the cache did not serve or keep",
            ["reason"], registry=r,
        )
        self.errors = Counter(
            "rls_cache_errors", "Failed or timed-out store operations", ["op"], registry=r
        )
        self.purges = Counter("rls_cache_purges", "Purges (namespace bumps) per API", ["api"],
                              registry=r)
        self.coalesced = Counter(
            "rls_cache_coalesced",
            "Identical misses that waited for a fill in progress, by outcome (hit or timeout)",
            ["result"], registry=r,
        )
        self.fills = Gauge(
            "rls_cache_fills_in_progress", "Misses whose response is being fetched and stored",
            registry=r,
        )
        self.lookup_seconds = Histogram(
            "rls_cache_lookup_seconds",
            "Store round trips of one lookup (version and entry reads; no coalescing wait)",
            buckets=(0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1),
            registry=r,
        )
        for reason in BYPASS_REASONS:
            self.bypasses.labels(reason)
        for op in ERROR_OPS:
            self.errors.labels(op)

    def snapshot(self) -> dict[str, Any]:
        """Counter values by name and label, for the admin `/cache/stats` endpoint."""
        out: dict[str, Any] = {}
        for family in self.registry.collect():
            if not family.name.startswith("rls_cache_") or family.type == "histogram":
                continue
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                name = sample.name.removeprefix("rls_cache_")
                if sample.labels:
                    label = next(iter(sample.labels.values()))
                    out.setdefault(name, {})[label] = sample.value
                else:
                    out[name] = sample.value
        return out
