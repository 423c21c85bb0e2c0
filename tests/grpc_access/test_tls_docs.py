"""The TLS metrics and reasons are documented (their registry exists only with --grpc-tls, so
the general metrics-doc test does not see them)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from rls.grpc_access.tls import TlsMetrics
from rls.grpc_access.tls_refusals import REASONS

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_metrics_doc_names_every_tls_metric_and_refusal_reason() -> None:
    doc = (DOCS / "metrics.md").read_text(encoding="utf-8")
    registry = CollectorRegistry()
    TlsMetrics(registry)
    for family in registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        assert f"`{name}`" in doc, name
    for reason in REASONS:
        assert f"`{reason}`" in doc, reason
