"""`--reference-metrics` (on under `/bin/ratelimit` with USE_PROMETHEUS=true) serves
envoyproxy/ratelimit's Prometheus series, as its default statsd mapping names and labels them,
computed from rls's own counters when /metrics is read.

The mapping pinned here is the reference's `default_mapper.yaml` (Envoy Gateway mounts the same
rules as its `PROMETHEUS_MAPPER_YAML`): a stat name `ratelimit.service.rate_limit.<stats
key>.<stat>` splits on its dots; two levels give `domain`, `key1` (a glob rule), three or more
give `domain`, `key1`, `key2` and drop the rest (a regex rule), so deeper limits add up.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rls.cli.serve import FLAGS
from rls.config.model import Unit
from rls.core.limits import Limit
from rls.observability.metrics import Metrics
from rls.observability.reference_metrics import PER_LIMIT_STATS, reference_families
from rls.settings.reference_env import plan

ROOT = Path(__file__).resolve().parents[2]
Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def served(metrics: Metrics) -> Series:
    """Every sample of /metrics' text, by (name as written, labels)."""
    text = metrics.exposition().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def labels(**pairs: str) -> frozenset[tuple[str, str]]:
    return frozenset(pairs.items())


def reference_metrics() -> Metrics:
    metrics = Metrics()
    metrics.derived.append(reference_families)
    return metrics


def hits(metrics: Metrics, key: str, count: int, limit: int = 5, stats_key: str | None = None,
         shadow: bool = False) -> None:
    """`count` single hits on a fresh limit of `limit` per hour, one after the other."""
    rule = Limit(limit, Unit.HOUR, full_key=key, shadow_mode=shadow)
    for used in range(count):
        metrics.record_limit(rule, stats_key, 1, used, used >= limit, shadow)


def test_stats_keys_split_into_domain_key1_key2_as_the_default_mapping_does() -> None:
    metrics = reference_metrics()
    hits(metrics, "eg.client_a", 2)                 # two levels: no key2
    hits(metrics, "eg.client_a.path_x", 3)          # three levels
    hits(metrics, "eg.client_a.path_x.method", 4)   # deeper: folded into the three-level series
    hits(metrics, "eg.remote_address", 1, stats_key="eg.remote_address_10.0.0.1")  # detailed
    series = served(metrics)
    total = "ratelimit_service_rate_limit_total_hits"
    assert series[(total, labels(domain="eg", key1="client_a"))] == 2
    assert series[(total, labels(domain="eg", key1="client_a", key2="path_x"))] == 3 + 4
    # an IPv4 value stays one level, as in the reference's stat name
    assert series[(total, labels(domain="eg", key1="remote_address_10_0_0_1"))] == 1
    assert sorted(n for n, _ in series if n == total) == [total] * 3


def test_per_limit_series_carry_rls_counts_under_the_reference_names_without_total() -> None:
    metrics = reference_metrics()
    hits(metrics, "eg.user", 8)                      # limit 5: 5 within (1 near), 3 over
    hits(metrics, "eg.team", 7, shadow=True)         # 2 over, let through by shadow mode
    series = served(metrics)
    user, team = labels(domain="eg", key1="user"), labels(domain="eg", key1="team")
    expected = {"total_hits": (8, 7), "within_limit": (5, 5), "near_limit": (1, 1),
                "over_limit": (3, 2), "shadow_mode": (0, 2)}
    assert set(expected) == set(PER_LIMIT_STATS)
    for stat, (user_value, team_value) in expected.items():
        name = f"ratelimit_service_rate_limit_{stat}"
        assert series[(name, user)] == user_value == series[(f"rls_limit_{stat}_total",
                                                             labels(key="eg.user"))]
        assert series[(name, team)] == team_value
        assert (name + "_total", user) not in series


def test_errors_by_err_type_start_at_zero_and_count_failed_calls() -> None:
    metrics = reference_metrics()
    metrics.prepare_domains(["eg"])
    name = "ratelimit_service_should_rate_limit_error"
    before = served(metrics)
    assert before[(name, labels(err_type="redis_error"))] == 0
    assert before[(name, labels(err_type="service_error"))] == 0
    for reason in ("store_down", "store_error", "store_slow"):
        metrics.count_failure_answer("eg", reason, "allow")
    metrics.count_failure_answer("eg", "overloaded", "unavailable")  # rls's own: not the store
    for reason in ("invalid_argument", "unavailable", "overloaded"):
        metrics.errors.labels(reason).inc()
    metrics.errors.labels("stalled").inc()  # an RLQS stream's error: not a ShouldRateLimit call
    metrics.count_request("eg", "OK")
    metrics.count_request("eg", "OVER_LIMIT")
    after = served(metrics)
    assert after[(name, labels(err_type="redis_error"))] == 3
    assert after[(name, labels(err_type="service_error"))] == 3
    # every ShouldRateLimit call: the two answered and the three rejected
    assert after[("ratelimit_service_total_requests",
                  labels(grpc_method="ShouldRateLimit"))] == 5


def test_response_time_and_config_loads() -> None:
    metrics = reference_metrics()
    for seconds in (0.0002, 0.003, 0.003):
        metrics.latency.observe(seconds)
    metrics.config_loads.labels("success").inc(2)
    metrics.config_loads.labels("error").inc()
    series = served(metrics)
    method = labels(grpc_method="ShouldRateLimit")
    assert series[("ratelimit_service_response_time_seconds_count", method)] == 3
    assert series[("ratelimit_service_response_time_seconds_sum", method)] == pytest.approx(
        0.0062)
    assert series[("ratelimit_service_response_time_seconds_bucket",
                   method | {("le", "0.0025")})] == 1
    assert series[("ratelimit_service_config_load_success", frozenset())] == 2
    assert series[("ratelimit_service_config_load_error", frozenset())] == 1


def test_without_the_setting_only_rls_names_are_served() -> None:
    metrics = Metrics()
    hits(metrics, "eg.user", 1)
    assert not [name for name, _ in served(metrics) if name.startswith("ratelimit_service")]


def test_bin_ratelimit_turns_them_on_with_use_prometheus() -> None:
    base = {"CONFIG_TYPE": "GRPC_XDS_SOTW"}
    assert "--reference-metrics" in plan({**base, "USE_PROMETHEUS": "true"}).argv
    assert "--reference-metrics" not in plan(base).argv
    assert "--reference-metrics" not in plan(
        {**base, "USE_PROMETHEUS": "true", "RLS_REFERENCE_METRICS": "off"}).argv
    assert "reference_metrics" in FLAGS


def test_metrics_doc_names_every_reference_series() -> None:
    doc = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    metrics = reference_metrics()
    names = {family.name for family in reference_families(list(metrics.registry.collect()))}
    missing = sorted(n for n in names if f"`{n}`" not in doc)
    assert not missing, f"docs/metrics.md lacks {missing}"
    assert not re.search(r"ratelimit_service_\w+_total\b", doc)
