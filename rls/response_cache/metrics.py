"""Prometheus metrics of the response cache (`rls_cache_*`), on a registry passed in.

Labels are bounded: `api` comes from the rules file, `reason`, `op` and `kind` from fixed sets
in the code; request values never become labels.

The write counters add up, so a lost write is always visible (docs/cache.md, "Metrics"):

    cacheable_misses{api} = stores{api} + store_failures{api}
                            + writes_dropped{kind="store", api} + (store jobs still queued)
    hits{api}             = refreshes{api} + refresh_failures{api}
                            + writes_dropped{kind="refresh", api} + (refresh jobs still queued)

`rls_cache_write_queue` is 0 once every write handed to the writer has an outcome.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rls.response_cache.jsonbody import (
    WEIGHT_SOURCES as WEIGHT_SOURCES,  # the `source` label values
)

BYPASS_REASONS = (
    "no_rule",  # no rule selects the request's API
    "method",  # the API has a rule, the method is not listed
    "request_no_store",  # request Cache-Control: no-store
    "request_no_cache",  # request Cache-Control: no-cache: lookup skipped, the response stored
    "partial_request_body",  # the request body did not arrive whole
    "not_json",  # key_fields: the request body is not one JSON object
    "json_too_large",  # key_fields: the request body is over the rule's max_json_bytes
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
    "malformed_header",  # :status or Content-Length no HTTP peer sends (a hostile caller)
)
ERROR_OPS = ("version", "get", "set", "expire", "purge", "decode")


class CacheMetrics:
    """The cache's families in three groups: how requests were answered, what the writer did
    with storable responses, and the in-process memory store."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.registry = r
        self._answer_metrics(r)
        self._write_metrics(r)
        self._memory_store_metrics(r)
        for reason in BYPASS_REASONS:
            self.bypasses.labels(reason)
        for op in ERROR_OPS:
            self.errors.labels(op)

    def _answer_metrics(self, r: CollectorRegistry) -> None:
        """Hits, misses, bypasses and the lookups that decided them."""
        self.hits = Counter(
            "rls_cache_hits", "Requests answered from the cache", ["api"], registry=r
        )
        self.misses = Counter(
            "rls_cache_misses", "Cacheable requests sent upstream (not in the cache)", ["api"],
            registry=r,
        )
        self.cacheable_misses = Counter(
            "rls_cache_cacheable_misses",
            "Misses whose response was storable and handed to the writer (x-cache: MISS)",
            ["api"], registry=r,
        )
        self.bypasses = Counter(
            "rls_cache_bypasses", "Requests or responses the cache did not serve or keep",
            ["reason"], registry=r,
        )
        self.coalesced = Counter(
            "rls_cache_coalesced",
            "Identical misses that waited for a fill in progress, by outcome (hit or timeout)",
            ["result"], registry=r,
        )
        self.fills = Gauge(
            "rls_cache_fills_in_progress", "Misses whose response is being fetched and stored",
            registry=r, multiprocess_mode="livesum",
        )
        self.lookup_seconds = Histogram(
            "rls_cache_lookup_seconds",
            "Store round trips of one lookup (version and entry reads; no coalescing wait)",
            buckets=(0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1),
            registry=r,
        )
        self.weights = Counter(
            "rls_cache_weights",
            "Request weights sent to Envoy for hits_from rules, by source: the JSON member, or "
            "why the body size was used instead",
            ["api", "source"], registry=r,
        )

    def _write_metrics(self, r: CollectorRegistry) -> None:
        """Stores, refreshes and purges: every storable response ends in one of these."""
        self.stores = Counter("rls_cache_stores", "Responses written to the store", ["api"],
                              registry=r)
        self.store_failures = Counter(
            "rls_cache_store_failures",
            "Storable responses the writer could not write (store error, timeout or down)",
            ["api"], registry=r,
        )
        self.refreshes = Counter(
            "rls_cache_refreshes", "Hits whose entry TTL was pushed back to the full TTL",
            ["api"], registry=r,
        )
        self.refresh_failures = Counter(
            "rls_cache_refresh_failures",
            "Hits whose TTL refresh failed (store error, timeout or down)", ["api"], registry=r,
        )
        self.writes_dropped = Counter(
            "rls_cache_writes_dropped",
            "Stores and refreshes never attempted: writer queue full, or shutdown deadline",
            ["kind", "api"], registry=r,
        )
        self.write_queue = Gauge(
            "rls_cache_write_queue", "Stores and refreshes queued or running in the writer",
            registry=r, multiprocess_mode="livesum",
        )
        self.write_queue_bytes = Gauge(
            "rls_cache_write_queue_bytes", "Entry bytes held by queued or running stores",
            registry=r, multiprocess_mode="livesum",
        )
        self.stored_bytes = Counter(
            "rls_cache_stored_bytes", "Bytes of entries written to the store", ["api"], registry=r
        )
        self.purges = Counter("rls_cache_purges", "Purges (namespace bumps) per API", ["api"],
                              registry=r)
        self.errors = Counter(
            "rls_cache_errors", "Failed or timed-out store operations", ["op"], registry=r
        )

    def _memory_store_metrics(self, r: CollectorRegistry) -> None:
        """The memory store's size and evictions (memory:// store only)."""
        self.memory_bytes = Gauge(
            "rls_cache_memory_store_bytes",
            "Bytes held by the in-process memory store (keys, values and per-entry overhead)",
            registry=r, multiprocess_mode="livesum",
        )
        self.memory_evictions = Counter(
            "rls_cache_memory_store_evictions",
            "Entries the memory store evicted (least recently used first) to stay in budget",
            registry=r,
        )

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
                    label = "/".join(sample.labels.values())  # e.g. "store/translate"
                    out.setdefault(name, {})[label] = sample.value
                else:
                    out[name] = sample.value
        return out
