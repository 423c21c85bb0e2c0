"""Small helpers shared by the hostile-input tests."""

from __future__ import annotations

from conftest import http_get
from prometheus_client.parser import text_string_to_metric_families


def metric(http_url: str, name: str, **labels: str) -> float:
    """One sample of rls's /metrics (0 when absent)."""
    status, body = http_get(http_url + "/metrics")
    assert status == 200
    want = tuple(sorted(labels.items()))
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name == name and tuple(sorted(s.labels.items())) == want:
                return s.value
    return 0.0
