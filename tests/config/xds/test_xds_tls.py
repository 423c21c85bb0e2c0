"""TLS and mTLS to the management server: the CA, the expected SAN
(CONFIG_GRPC_XDS_SERVER_TLS_SAN, checked: a certificate without that name is refused) and the
client certificate, with the reference's variables."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
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
