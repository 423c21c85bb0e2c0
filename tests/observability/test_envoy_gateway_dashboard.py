"""Envoy Gateway's rate-limit dashboard and a typical error alert, evaluated by a real
Prometheus against `/bin/ratelimit` run with EG's environment (USE_PROMETHEUS=true).

The expressions are copied, as data, from the dashboard Envoy Gateway ships in its add-ons Helm
chart, "Global Ratelimit" (`global-ratelimit.json`), its `$DefaultDomain` variable at its
default. Its stat panels name one route of EG's rate-limit task (HTTPRoute `http-ratelimit`,
host `ratelimit.example`, one header match) in the labels the reference's statsd mapping gives
it; the config below is what EG's translator pushes for that route. Every panel has
`noValue: 0`: without the reference's series rls showed 0 everywhere and the alert never fired.

The dashboard's "CPU Fraction" panel reads `go_memstats_gc_cpu_fraction`, a gauge of Go's
runtime; rls is Python and serves no `go_*` series (docs/envoy-gateway.md says so).
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from conftest import start_redis, wait_until
from dropin.helpers import (
    Ratelimit,
    eg_certificates,
    eg_environment,
    grpc_channel,
    start_ratelimit,
    write,
)
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from .prom import Prometheus, prometheus_binaries, start_prometheus

pytestmark = pytest.mark.slow

DEFAULT_DOMAIN = "default/eg/http"  # the dashboard's DefaultDomain variable
ROUTE = "httproute/default/http-ratelimit/rule/0/match/0/ratelimit_example"
MATCH = "rule-0-match-0"
_STAT_LABELS = (f'domain="$DefaultDomain", key1="{ROUTE}_{ROUTE}", '
                f'key2="{MATCH}_{MATCH}"')
PANELS = {
    "Resident Memory":
        '(process_resident_memory_bytes{app_kubernetes_io_component="ratelimit"})/1000000',
    "Virtual Memory":
        '(process_virtual_memory_bytes{app_kubernetes_io_component="ratelimit"})/1000000',
    "Total Hits": "ratelimit_service_rate_limit_total_hits{" + _STAT_LABELS + "}",
    "Near Limit": "ratelimit_service_rate_limit_near_limit{" + _STAT_LABELS + "}",
    "Over Limit": "ratelimit_service_rate_limit_over_limit{" + _STAT_LABELS + "}",
}
# The pod label EG gives its rate-limit Deployment, as Kubernetes discovery labels the series.
POD_LABELS = {"app_kubernetes_io_component": "ratelimit"}
# A typical alert on the reference's error counter: some calls failed in the last 5 minutes.
ERROR_ALERT = "sum by (err_type) (increase(ratelimit_service_should_rate_limit_error[5m])) > 0"

LIMIT = 5  # per hour
CALLS = 8  # 5 within (the 5th near: past 80 %), 3 over
EXPECTED = {"Total Hits": CALLS, "Near Limit": 1, "Over Limit": CALLS - LIMIT}
CONFIG = f"""domain: {DEFAULT_DOMAIN}
descriptors:
  - key: {ROUTE}
    value: {ROUTE}
    descriptors:
      - key: {MATCH}
        value: {MATCH}
        rate_limit: {{unit: hour, requests_per_unit: {LIMIT}}}
  - key: client                 # another route's limit, never over
    rate_limit: {{unit: hour, requests_per_unit: 1000}}
"""
OK, OVER = rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT


def route_call(channel: grpc.Channel, domain: str = DEFAULT_DOMAIN,
               pairs: tuple[tuple[str, str], ...] = ((ROUTE, ROUTE), (MATCH, MATCH))) -> int:
    """One call as EG's Envoy sends it for the route (or for `pairs`); the overall code."""
    entries = [ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in pairs]
    request = rls_pb2.RateLimitRequest(
        domain=domain, descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=entries)])
    code: int = rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(
        request, timeout=10).overall_code
    return code


def start_eg_ratelimit(root: Path, tmp_path: Path, redis_port: int,
                       extra: dict[str, str] | None = None) -> tuple[Ratelimit, Path]:
    """`ratelimit` with EG's environment, limits from files (EG's config, not its transport),
    and the mTLS certificates EG mounts; (the process, the certificate directory)."""
    certs = eg_certificates(root).mount
    env, _ports = eg_environment(root, redis_port, "FILE")
    env.update(extra or {})
    write(root / "data/ratelimit/config/eg.yaml", CONFIG)
    return start_ratelimit(env, root, tmp_path), certs


def panel_value(prom: Prometheus, panel: str) -> float | None:
    """The single value a stat panel shows (None: no data, shown as the panel's noValue)."""
    result = prom.query(PANELS[panel].replace("$DefaultDomain", DEFAULT_DOMAIN))
    assert len(result) <= 1, (panel, result)
    return float(result[0]["value"][1]) if result else None


def test_the_dashboards_panels_and_the_error_alert_read_rls(tmp_path: Path) -> None:
    redis = start_redis()
    root = tmp_path / "root"
    root.mkdir()
    rl, certs = start_eg_ratelimit(root, tmp_path, redis.port)
    prom: Prometheus | None = None
    try:
        prometheus, _ = prometheus_binaries()
        (tmp_path / "prometheus").mkdir()
        prom = start_prometheus(prometheus, tmp_path / "prometheus",
                                [f"127.0.0.1:{rl.ports.prometheus}"], [], labels=POD_LABELS)
        p = prom
        # The error series exist at 0 before any error, so increase() sees the first ones.
        wait_until(lambda: len(p.query("ratelimit_service_should_rate_limit_error == 0")) == 2,
                   timeout=20, what="both err_type series scraped at 0", log=rl.log)
        with grpc_channel(rl, certs) as channel:
            codes = [route_call(channel) for _ in range(CALLS)]
            assert codes == [OK] * LIMIT + [OVER] * (CALLS - LIMIT), rl.log()
            try:
                route_call(channel, domain="")  # rejected: the reference's service_error
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
            else:
                raise AssertionError("a call without a domain was answered")
            redis.stop()
            # The store is away: /bin/ratelimit answers UNAVAILABLE as the reference answers an
            # error, and counts a redis_error. Another limit than the route's: that one is
            # over, and the local over-limit cache would answer it.
            try:
                route_call(channel, pairs=(("client", "a"),))
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
            else:
                raise AssertionError("a call the store could not decide was answered")

        def shown() -> dict[str, float | None]:
            return {panel: panel_value(p, panel) for panel in PANELS}

        def all_shown() -> bool:
            values = shown()
            return all(values[panel] == value for panel, value in EXPECTED.items()) and all(
                (values[panel] or 0) > 0 for panel in PANELS)

        try:
            wait_until(all_shown, timeout=20, what="every panel's value")
        except TimeoutError:
            raise AssertionError(f"panels show {shown()}, expected {EXPECTED}") from None
        wait_until(lambda: {r["metric"]["err_type"] for r in p.query(ERROR_ALERT)}
                   == {"redis_error", "service_error"}, timeout=20,
                   what="the error alert firing for both error types")
    finally:
        if prom is not None:
            prom.stop()
        rl.stop()
        redis.stop()


def test_under_workers_the_series_sum_every_worker(tmp_path: Path) -> None:
    """`RLS_WORKERS=2`: the reference's series come from the counts summed over the workers."""
    redis = start_redis()
    root = tmp_path / "root"
    root.mkdir()
    rl, certs = start_eg_ratelimit(root, tmp_path, redis.port, {"RLS_WORKERS": "2"})
    try:
        for _ in range(CALLS):  # a connection per call: the kernel spreads them over workers
            with grpc_channel(rl, certs) as channel:
                route_call(channel)

        def total_hits() -> tuple[float, float]:
            status, text = rl.http("/metrics", port=rl.ports.prometheus)
            assert status == 200, text
            samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
            own = sum(s.value for s in samples if s.name == "rls_limit_total_hits_total")
            reference = sum(s.value for s in samples
                            if s.name == "ratelimit_service_rate_limit_total_hits")
            return own, reference

        wait_until(lambda: total_hits() == (CALLS, CALLS), timeout=20,
                   what="both workers' hits in rls's and the reference's series", log=rl.log)
    finally:
        rl.stop()
        redis.stop()
