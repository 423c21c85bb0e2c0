"""TLS and mTLS to the management server: the CA, the expected SAN
(CONFIG_GRPC_XDS_SERVER_TLS_SAN, checked: a certificate without that name is refused) and the
client certificate, with the reference's variables. rls's own failed handshakes with the
management server are no refused clients of its gRPC listeners."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_access.helpers import channel, samples, should_rate_limit
from support.certs import CertAuthority
from support.metrics import metric
from support.waiting import wait_until

from .ads_server import AdsServer, TlsFiles
from .calls import OK, OVER_LIMIT, decide
from .certs import SERVER_SAN, Certs, make_certs
from .conftest import xds_env
from .test_xds_config import basic


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    workdir = tmp_path / "certs"
    workdir.mkdir()
    return make_certs(workdir)


def tls_server(certs: Certs, mutual: bool) -> AdsServer:
    files = TlsFiles(str(certs.server_cert), str(certs.server_key),
                     str(certs.ca) if mutual else None)
    server = AdsServer(tls=files).start()
    server.set_snapshot("1", [basic()])
    return server


def tls_env(server: AdsServer, certs: Certs, san: str, client_cert: bool) -> dict[str, str]:
    env = xds_env(server, CONFIG_GRPC_XDS_SERVER_USE_TLS="true",
                  CONFIG_GRPC_XDS_SERVER_TLS_CACERT=str(certs.ca),
                  CONFIG_GRPC_XDS_SERVER_TLS_SAN=san)
    if client_cert:
        env["CONFIG_GRPC_XDS_CLIENT_TLS_CERT"] = str(certs.client_cert)
        env["CONFIG_GRPC_XDS_CLIENT_TLS_KEY"] = str(certs.client_key)
    return env


def test_mtls_with_the_expected_san_gets_the_config(
    certs: Certs, rls_factory: Callable[..., Any]
) -> None:
    server = tls_server(certs, mutual=True)
    try:
        rls = rls_factory(env=tls_env(server, certs, SERVER_SAN, client_cert=True))
        ack = server.wait_ack("1")
        assert ack.version_info == "1"
        assert metric(rls.http_url, "rls_xds_connected") == 1
        # The served domain's limit is the one sent over the mutually authenticated stream.
        assert decide(rls.grpc_addr, "basic", ("one_per_minute", "mtls")) == OK
        assert decide(rls.grpc_addr, "basic", ("one_per_minute", "mtls")) == OVER_LIMIT
    finally:
        server.stop()


@pytest.mark.parametrize(("san", "client_cert"), [("other.example", True), (SERVER_SAN, False)])
def test_a_wrong_san_or_a_missing_client_certificate_gets_nothing(
    certs: Certs, rls_factory: Callable[..., Any], san: str, client_cert: bool
) -> None:
    server = tls_server(certs, mutual=True)
    try:
        env = tls_env(server, certs, san, client_cert)
        env["FORCE_START_WITHOUT_INITIAL_CONFIG"] = "true"
        rls = rls_factory(env=env)
        wait_until(lambda: metric(rls.http_url, "rls_xds_reconnects_total",
                                  reason="connect_failed") >= 2, 20, "refused connects")
        assert not server.requests or not server.acks("1")
        assert metric(rls.http_url, "rls_xds_connected") == 0
    finally:
        server.stop()


TOKEN = "s3cret-grpc-token"


def test_an_untrusted_control_plane_is_no_refused_client_and_a_call_without_the_token_is(
    certs: Certs, rls_factory: Callable[..., Any], tmp_path: Path
) -> None:
    """rls's own handshakes with a control plane whose certificate it does not trust fail again
    and again: none of them is a client refused by rls's gRPC TLS, whose counter stays 0 while
    no client came. A call without the token (or with a wrong one) is counted, by reason."""
    server = tls_server(certs, mutual=False)
    listener_ca = CertAuthority.create(tmp_path / "listener-ca")  # not the control plane's CA
    listener = listener_ca.issue("rls")
    try:
        env = xds_env(server, CONFIG_GRPC_XDS_SERVER_USE_TLS="true",
                      CONFIG_GRPC_XDS_SERVER_TLS_CACERT=str(listener_ca.cert),
                      CONFIG_GRPC_XDS_SERVER_TLS_SAN=SERVER_SAN,
                      FORCE_START_WITHOUT_INITIAL_CONFIG="true", RLS_GRPC_TOKEN=TOKEN)
        rls = rls_factory(env=env, args=("--grpc-tls", "on", "--grpc-tls-cert",
                                         str(listener.cert), "--grpc-tls-key", str(listener.key)))
        wait_until(lambda: metric(rls.http_url, "rls_xds_reconnects_total",
                                  reason="connect_failed") >= 3, 20,
                   "refused handshakes with the control plane")
        assert not server.requests
        refused = samples(rls.http_url, "rls_grpc_tls_refused_total")
        assert refused and not any(refused.values()), f"{refused}\n{rls.log()}"
        assert samples(rls.http_url, "rls_grpc_token_refused_total") == {
            "missing": 0, "wrong": 0}

        with channel(rls.grpc_addr, listener_ca.cert) as ch:
            for token in ("", "wrong", "wrong"):
                with pytest.raises(grpc.RpcError) as denied:
                    should_rate_limit(ch, token)
                assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert samples(rls.http_url, "rls_grpc_token_refused_total") == {
            "missing": 1, "wrong": 2}
        refused = samples(rls.http_url, "rls_grpc_tls_refused_total")
        assert not any(refused.values()), refused  # a token refusal is not a TLS one
    finally:
        server.stop()
