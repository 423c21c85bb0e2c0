"""Prometheus series of quota mode, registered on the app's registry (bounded labels only)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

ERROR_REASONS = ("backend", "invalid", "bucket_cap", "unsupported")
ACTIONS = ("token_bucket", "allow_all", "deny_all", "abandon")
MAX_CACHED_USAGE = 10_000  # (limit, result) children kept at hand; limits come from the config


class QuotaMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.streams = Gauge(
            "rls_quota_streams", "Open RLQS streams", registry=registry,
            multiprocess_mode="livesum",
        )
        self.buckets = Gauge(
            "rls_quota_buckets", "RLQS buckets tracked over all streams", registry=registry,
            multiprocess_mode="livesum",
        )
        self.reports = Counter(
            "rls_quota_reports", "RLQS usage report messages received", registry=registry
        )
        self.assignments = Counter(
            "rls_quota_assignments",
            "Bucket actions sent, by kind (token_bucket, allow_all, deny_all, abandon)",
            ["action"], registry=registry,
        )
        self.actions = {action: self.assignments.labels(action) for action in ACTIONS}
        # `limit` is the limit's config path, or _unmatched / _unlimited / _unsupported.
        self.usage = Counter(
            "rls_quota_usage",
            "Requests Envoy reported per limit, by result (allowed, denied)",
            ["limit", "result"], registry=registry,
        )
        # Children looked up once: `labels()` costs microseconds, paid per bucket and report.
        self._usage: dict[tuple[str, str], Any] = {}
        self.errors = Counter(
            "rls_quota_errors",
            "RLQS problems by reason (backend, invalid, bucket_cap, bucket_id_size, stalled, "
            "unsupported)",
            ["reason"], registry=registry,
        )
        for reason in ERROR_REASONS:  # at 0 from the start: rate() counts the first burst
            self.errors.labels(reason)
        self.queued_bytes = Gauge(
            "rls_quota_queued_bytes",
            "Bytes of RLQS answers queued for clients that have not read them yet",
            registry=registry, multiprocess_mode="livesum",
        )

    def count_usage(self, limit: str, result: str, requests: int) -> None:
        """`requests` Envoy reported as `result` (allowed, denied) for `limit`."""
        child = self._usage.get((limit, result))
        if child is None:
            child = self.usage.labels(limit, result)
            if len(self._usage) < MAX_CACHED_USAGE:
                self._usage[(limit, result)] = child
        child.inc(requests)
