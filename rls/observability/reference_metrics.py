"""envoyproxy/ratelimit's Prometheus series, derived from rls's own families at scrape time.

The reference counts in statsd names (`ratelimit.service.rate_limit.<stats key>.over_limit`,
`ratelimit.service.call.should_rate_limit.<error>`, …) and turns them into Prometheus
series with a statsd-exporter mapping: its built-in default, or the file named by
`PROMETHEUS_MAPPER_YAML` (Envoy Gateway mounts one with the default's rules). Envoy Gateway's
"Global Ratelimit" dashboard and alerts written for the reference query those series; without
them their panels read 0 and the alerts never fire.

`reference_families` computes them from the families rls has just collected (after the
per-limit buffers were flushed), so nothing is counted a second time on the decision path and
the two sets of numbers cannot drift apart. The default mapping, reproduced here:

- `ratelimit.service.rate_limit.<d>.<k1>.<stat>` (a glob rule: exactly two levels) ->
  `ratelimit_service_rate_limit_<stat>{domain="d", key1="k1"}`;
- `ratelimit.service.rate_limit.<d>.<k1>.<k2>[.<more>].<stat>` (a regex rule) ->
  `{domain="d", key1="k1", key2="k2"}`: deeper levels are dropped, so the limits that share
  their first two levels add up in one series;
- `ratelimit.service.call.should_rate_limit.<err>` ->
  `ratelimit_service_should_rate_limit_error{err_type}`;
- `ratelimit_server.ShouldRateLimit.total_requests` / `.response_time` ->
  `ratelimit_service_total_requests{grpc_method}` and the histogram
  `ratelimit_service_response_time_seconds{grpc_method}`;
- `ratelimit.service.config_load_<result>` -> `ratelimit_service_config_load_<result>`.

The stats key splits on its dots exactly as the reference's statsd name does, because rls's
`key` label is the stats key as the reference's stat names carry it
(rls.observability.metrics.stat_label: `:`, `|` and the dots of IPv4 addresses already
written `_`). So the labels, and their
number, are the reference's: keys, and request values only where `detailed_metric` /
`value_to_metric` put them in the name.

The reference's exporter writes these as counters without a `_total` suffix. prometheus-client
adds `_total` to every counter it writes, so they are written untyped, under the reference's
exact names (PromQL reads them the same: `rate()`, `increase()` and the dashboard's queries).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client.metrics_core import HistogramMetricFamily, Metric

from rls.observability.metrics import FAILURE_REASONS, REQUEST_ERROR_REASONS

# The reference's per-limit stats, each kept by rls under `rls_limit_<stat>{key}`.
PER_LIMIT_STATS = ("near_limit", "over_limit", "total_hits", "within_limit", "shadow_mode")
LEVEL_LABELS = ("domain", "key1", "key2")
GRPC_METHOD = "ShouldRateLimit"
# Calls the store did not decide, by rls's reason: the reference fails each such call with its
# Redis error (err_type="redis_error"). rls's own overload is counted with the rejected calls.
STORE_REASONS = tuple(r for r in FAILURE_REASONS if r != "overloaded")
# The ShouldRateLimit calls rls answers with a gRPC error (the reference: err_type="service_error"
# for an empty domain, no descriptors, no configuration loaded). A store failure answered with an
# error (`--failure-mode error`) is a redis_error, counted above.
SERVICE_REASONS = tuple(r for r in REQUEST_ERROR_REASONS if r != "store_failed")
ERR_TYPES = ("redis_error", "service_error")

_HELP = {
    "near_limit": "Hits near the limit (envoyproxy/ratelimit's name; from rls_limit_near_limit)",
    "over_limit": "Hits over the limit (envoyproxy/ratelimit's name; from rls_limit_over_limit)",
    "total_hits": "Hits checked (envoyproxy/ratelimit's name; from rls_limit_total_hits)",
    "within_limit": "Hits within the limit (envoyproxy/ratelimit's name; from "
    "rls_limit_within_limit)",
    "shadow_mode": "Over-limit hits let through by shadow mode (envoyproxy/ratelimit's name; "
    "from rls_limit_shadow_mode)",
}


def mapper_labels(stats_key: str) -> tuple[tuple[str, str], ...] | None:
    """The labels the reference's default mapping gives a per-limit stat of `stats_key` (rls's
    `key` label), or None when no rule maps it (a key without a descriptor level)."""
    levels = stats_key.split(".")
    if len(levels) < 2:
        return None
    return tuple(zip(LEVEL_LABELS, levels[:3], strict=False))


def _samples(
    families: dict[str, Metric], family: str, sample: str
) -> Iterable[tuple[dict[str, str], float]]:
    """(labels, value) of the samples named `sample` in the collected `family`."""
    found = families.get(family)
    if found is None:
        return ()
    return ((s.labels, s.value) for s in found.samples if s.name == sample)


def _untyped(name: str, documentation: str) -> Metric:
    return Metric(name, documentation, "unknown")


def _per_limit(families: dict[str, Metric]) -> list[Metric]:
    out = []
    mapping: dict[str, tuple[tuple[str, str], ...] | None] = {}  # per key, for the five stats
    for stat in PER_LIMIT_STATS:
        sums: dict[tuple[tuple[str, str], ...], float] = {}
        for labels, value in _samples(families, f"rls_limit_{stat}", f"rls_limit_{stat}_total"):
            key = labels.get("key", "")
            if key in mapping:
                mapped = mapping[key]
            else:
                mapped = mapping[key] = mapper_labels(key)
            if mapped is not None:
                sums[mapped] = sums.get(mapped, 0.0) + value
        metric = _untyped(f"ratelimit_service_rate_limit_{stat}", _HELP[stat])
        for mapped, total in sums.items():
            metric.add_sample(metric.name, dict(mapped), total)
        out.append(metric)
    return out


def _sum(families: dict[str, Metric], family: str, label: str, values: Sequence[str]) -> float:
    return sum(v for labels, v in _samples(families, family, family + "_total")
               if labels.get(label) in values)


def _calls(families: dict[str, Metric]) -> list[Metric]:
    """Failed calls by the reference's error type, all calls, and how long deciding took."""
    errors = {
        "redis_error": _sum(families, "rls_failure_mode_answers", "reason", STORE_REASONS),
        "service_error": _sum(families, "rls_request_errors", "reason", SERVICE_REASONS),
    }
    failed = _untyped(
        "ratelimit_service_should_rate_limit_error",
        "ShouldRateLimit calls that failed, by envoyproxy/ratelimit's err_type (redis_error: "
        "the store did not decide, rls_failure_mode_answers; service_error: rejected, "
        "rls_request_errors)",
    )
    for err_type in ERR_TYPES:
        failed.add_sample(failed.name, {"err_type": err_type}, errors[err_type])
    answered = sum(v for _, v in _samples(families, "rls_requests", "rls_requests_total"))
    total = _untyped(
        "ratelimit_service_total_requests",
        "ShouldRateLimit calls, answered or failed (envoyproxy/ratelimit's name; from "
        "rls_requests and rls_request_errors)",
    )
    failed_calls = _sum(families, "rls_request_errors", "reason", REQUEST_ERROR_REASONS)
    total.add_sample(total.name, {"grpc_method": GRPC_METHOD}, answered + failed_calls)
    return [failed, total, *_response_time(families)]


def _response_time(families: dict[str, Metric]) -> list[Metric]:
    buckets = [(labels["le"], value) for labels, value
               in _samples(families, "rls_decision_seconds", "rls_decision_seconds_bucket")]
    if not buckets:
        return []
    total = next((v for _, v in _samples(families, "rls_decision_seconds",
                                         "rls_decision_seconds_sum")), 0.0)
    histogram = HistogramMetricFamily(
        "ratelimit_service_response_time_seconds",
        "Time to decide one ShouldRateLimit call, seconds (envoyproxy/ratelimit's name; "
        "rls_decision_seconds' buckets)",
        labels=["grpc_method"],
    )
    histogram.add_metric([GRPC_METHOD], buckets, total)
    return [histogram]


def _config_loads(families: dict[str, Metric]) -> list[Metric]:
    out = []
    for result in ("success", "error"):
        metric = _untyped(f"ratelimit_service_config_load_{result}",
                          f"Config loads, result {result} (envoyproxy/ratelimit's name; from "
                          "rls_config_loads)")
        metric.add_sample(metric.name, {}, _sum(families, "rls_config_loads", "result", (result,)))
        out.append(metric)
    return out


def reference_families(collected: Sequence[Metric]) -> list[Metric]:
    """The reference's series (default mapping) computed from rls's collected families."""
    families = {family.name: family for family in collected}
    return [*_per_limit(families), *_calls(families), *_config_loads(families)]
