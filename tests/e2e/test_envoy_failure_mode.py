"""`--failure-mode error` hands a store failure back to Envoy, through a real Envoy 1.40.

With its Redis stopped, rls answers every call with a fast gRPC UNAVAILABLE instead of its own
OK or OVER_LIMIT, so Envoy's `failure_mode_deny` decides, as it does with the reference (which
returns an error when Redis fails): with `true` (Envoy Gateway's failClosed) every request is
denied, with `false` every request passes. Both within Envoy's filter timeout: rls answers each
call itself (counted as a failure-mode `error` answer), and Envoy records no timeout.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.redis_server import start_redis

from .harness import (
    ADMIN_PORT,
    BACKEND_PORT,
    LISTENER_PORT,
    RLS_PORT,
    Backend,
    Envoy,
    free_port,
    http_get_text,
    load_gateway,
    rewrite_ports,
    start_envoy,
    wait_for,
)

pytestmark = pytest.mark.envoy

CALLS = 20
DESCRIPTORS = """\
domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 1000000}
"""


def envoy_config(deny: bool) -> dict[str, Any]:
    config = load_gateway("token-budget.yaml")
    for listener in config["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for http_filter in chain["filters"][0]["typed_config"]["http_filters"]:
                if http_filter["name"] == "envoy.filters.http.ratelimit":
                    http_filter["typed_config"]["failure_mode_deny"] = deny
    return config


@pytest.mark.parametrize("deny", [True, False], ids=["failure_mode_deny", "failure_mode_allow"])
def test_a_stopped_redis_leaves_the_decision_to_envoys_failure_mode(
    deny: bool, tmp_path: Path, rls_factory: Callable[..., Any], backend: Backend,
    envoy_binary: str,
) -> None:
    redis = start_redis()
    envoy: Envoy | None = None
    try:
        config_file = tmp_path / "llm.yaml"
        config_file.write_text(DESCRIPTORS)
        rls = rls_factory(config_file, args=("--redis-url", redis.url, "--failure-mode", "error"))
        listener, admin = free_port(), free_port()
        envoy = start_envoy(envoy_binary, rewrite_ports(envoy_config(deny), {
            LISTENER_PORT: listener, ADMIN_PORT: admin, RLS_PORT: rls.grpc_port,
            BACKEND_PORT: backend.port,
        }), tmp_path, listener, admin)

        def request() -> int:
            assert envoy is not None
            return envoy.request("GET", "/v1/chat", headers={"x-tenant": "acme"}).status

        # With Redis up: decided by rls (Envoy has its connection to rls from here on).
        wait_for(lambda: request() == 200 and envoy is not None
                 and envoy.counters().get("cluster.backend.ratelimit.ok", 0) > 0,
                 15.0, "a decision through Envoy -> rls", alive=envoy.alive, log=envoy.log)
        redis.stop()

        statuses = [request() for _ in range(CALLS)]
        expected = 500 if deny else 200  # Envoy's default status_on_error: 500
        assert statuses == [expected] * CALLS, f"{statuses}\n{envoy.log()}\n{rls.log()}"
        stats = envoy.counters("cluster.")
        assert stats.get("cluster.backend.ratelimit.error", 0) == CALLS, stats
        if not deny:
            assert stats.get("cluster.backend.ratelimit.failure_mode_allowed", 0) == CALLS, stats
        # rls answered every call itself, within Envoy's timeout.
        assert stats.get("cluster.ratelimit_service.upstream_rq_timeout", 0) == 0, stats
        answered = sum_metric(rls, "rls_failure_mode_answers_total", answer="error")
        assert answered == CALLS, rls.log()
    finally:
        if envoy is not None:
            envoy.stop()
        redis.stop()


def sum_metric(rls: Any, name: str, **labels: str) -> float:
    status, text = http_get_text(rls.http_url + "/metrics")
    assert status == 200, text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )
