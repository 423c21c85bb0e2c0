"""Clients for the gRPC TLS tests: grpc channels with or without a certificate, a stdlib TLS
handshake that returns the certificate the server presented, and the refusal counters."""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.certs import CertAuthority, Issued
from support.net import http_call

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
EXTPROC = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
SAN = "spiffe://rls.test/ns/edge/sa/envoy"
ROOT = Path(__file__).resolve().parents[2]  # the checkout
EXAMPLE = ROOT / "config" / "example.yaml"  # the shipped descriptor config the tests serve


@dataclass(frozen=True)
class Pki:
    """A CA with a server certificate and clients of every kind the tests present."""

    ca: CertAuthority
    server: Issued
    client: Issued  # the required SAN
    wrong_san: Issued  # same CA, another SAN
    expired: Issued
    stranger: Issued  # from another CA

    @classmethod
    def create(cls, directory: Path) -> Pki:
        ca = CertAuthority.create(directory / "ca")
        return cls(
            ca,
            ca.issue("server"),
            ca.issue("client", sans=(f"URI:{SAN}",), client=True),
            ca.issue("wrong-san", sans=("URI:spiffe://rls.test/ns/edge/sa/other",), client=True),
            ca.issue("expired", sans=(f"URI:{SAN}",), client=True, expired=True),
            CertAuthority.create(directory / "other-ca", "another CA").issue(
                "stranger", sans=(f"URI:{SAN}",), client=True),
        )

    def server_args(self, san: bool = True) -> tuple[str, ...]:
        return ("--grpc-tls", "on", "--grpc-tls-cert", str(self.server.cert),
                "--grpc-tls-key", str(self.server.key),
                "--grpc-tls-client-ca", str(self.ca.cert),
                *(("--grpc-tls-client-san", SAN) if san else ()))


def channel(addr: str, ca: Path | None, client: Issued | None = None) -> grpc.Channel:
    """A plaintext channel (ca None) or a TLS one trusting `ca`, presenting `client`."""
    if ca is None:
        return grpc.insecure_channel(addr)
    key, chain = client.read() if client is not None else (None, None)
    creds = grpc.ssl_channel_credentials(ca.read_bytes(), key, chain)
    return grpc.secure_channel(addr, creds)


def connects(ch: grpc.Channel, timeout: float = 3.0) -> bool:
    """Whether the channel gets READY (for TLS: the handshake succeeded)."""
    try:
        grpc.channel_ready_future(ch).result(timeout=timeout)
    except grpc.FutureTimeoutError:
        return False
    return True


def health(ch: grpc.Channel, token: str = "") -> int:
    meta = (("authorization", f"Bearer {token}"),) if token else ()
    answer = health_pb2_grpc.HealthStub(ch).Check(
        health_pb2.HealthCheckRequest(), timeout=5, metadata=meta)
    return int(answer.status)


def should_rate_limit(ch: grpc.Channel, token: str = "", user: str = "alice",
                      timeout: float = 5.0) -> int:
    meta = (("authorization", f"Bearer {token}"),) if token else ()
    entries = [ratelimit_pb2.RateLimitDescriptor.Entry(key="remote_address", value=user)]
    request = rls_pb2.RateLimitRequest(
        domain="gateway", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=entries)])
    answer = rls_pb2_grpc.RateLimitServiceStub(ch).ShouldRateLimit(
        request, timeout=timeout, metadata=meta)
    return int(answer.overall_code)


def extproc_code(ch: grpc.Channel, token: str = "") -> grpc.StatusCode:
    """The status of an ext_proc stream that sends nothing (OK when the call is let in)."""
    meta = (("authorization", f"Bearer {token}"),) if token else ()
    call = ch.stream_stream(EXTPROC)(iter(()), timeout=5, metadata=meta)
    try:
        for _ in call:
            pass
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[attr-defined, no-any-return]
    return grpc.StatusCode.OK


def presented_certificate(port: int, ca: Path, client: Issued) -> bytes:
    """DER of the certificate the server presents to a new connection (a stdlib handshake)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.load_cert_chain(str(client.cert), str(client.key))
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def der_of(cert: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(cert.read_text())


def samples(http_url: str, name: str) -> dict[str, float]:
    """Every sample of `name` on rls's /metrics, by its `reason` label (empty when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    _, text = http_call(http_url, "GET", "/metrics")
    return {sample.labels.get("reason", ""): float(sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == name}


def metric(http_url: str, name: str, **labels: str) -> float:
    """One sample of rls's /metrics (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    _, text = http_call(http_url, "GET", "/metrics")
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0
