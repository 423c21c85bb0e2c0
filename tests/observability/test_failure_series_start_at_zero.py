"""Issue 25 item 2: every labelled failure counter has its known series at 0 before any
traffic, so rate() counts the first burst (a series born at 1 shows no increase)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import http_get
from prometheus_client.parser import text_string_to_metric_families

from rls.observability.metrics import FAILURE_ANSWERS, FAILURE_REASONS, OVERLOAD_ANSWERS

pytestmark = pytest.mark.slow

CONFIG = (
    "domain: {name}\ndescriptors:\n  - key: k\n"
    "    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
)


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_failure_counters_exist_at_zero_before_any_call(rls_factory, tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    for name in ("shop", "api"):
        (cfg / f"{name}.yaml").write_text(CONFIG.format(name=name))
    proc = rls_factory(cfg)
    status, raw = http_get(proc.http_url + "/metrics")
    assert status == 200
    found = samples(raw.decode())

    def at_zero(name: str, **labels: str) -> bool:
        return found.get((name, frozenset(labels.items()))) == 0.0

    for domain in ("shop", "api"):
        for reason in FAILURE_REASONS:
            for answer in FAILURE_ANSWERS:
                assert at_zero("rls_failure_mode_answers_total", domain=domain, reason=reason,
                               answer=answer), (domain, reason, answer)
        for answer in OVERLOAD_ANSWERS:
            assert at_zero("rls_failure_mode_answers_total", domain=domain,
                           reason="overloaded", answer=answer)
    for reason in ("invalid_argument", "overloaded", "unavailable"):
        assert at_zero("rls_request_errors_total", reason=reason), reason
    assert at_zero("rls_config_loads_total", result="error")
    assert at_zero("rls_backend_errors_total", backend="memory", failure_mode="allow")
    for reason in ("backend", "invalid", "bucket_cap", "unsupported"):
        assert at_zero("rls_quota_errors_total", reason=reason), reason
    for op, code in (("add", "unavailable"), ("get", "unavailable"), ("get", "stale")):
        assert at_zero("rls_counters_items_total", op=op, code=code), (op, code)
