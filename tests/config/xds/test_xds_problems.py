"""A control plane rls cannot reach: the log says what is wrong and which variable to change,
once and then at most every minute, with nothing from grpc-core beside it; /rlconfig shows
the error with its time, and drops it once the stream is back.

The classification is checked over real failures: a real gRPC client against the in-test ADS
server in each misconfiguration, gRPC's own error text fed to rls.config.xds.problems.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from support.metrics import metric
from support.net import free_port
from support.waiting import wait_until

from rls.config.xds import problems
from rls.config.xds.problems import classify, explain
from rls.settings import Settings
from rls.settings.environment import REFERENCE_ENV

from .ads_server import AdsServer, TlsFiles
from .certs import SERVER_SAN, Certs, make_certs
from .conftest import xds_env
from .test_xds_config import basic, rlconfig

GRPC_CORE_LINE = re.compile(r"^[IWE]\d{4} \d\d:\d\d:\d\d", re.MULTILINE)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Certs, Certs]:
    """The control plane's CA and certificates, and another CA's (a client it does not trust,
    a CA that did not sign the control plane)."""
    ours, other = tmp_path_factory.mktemp("ours"), tmp_path_factory.mktemp("other")
    return make_certs(ours), make_certs(other)


@pytest.fixture(scope="module")
def servers(pki: tuple[Certs, Certs]) -> Iterator[dict[str, AdsServer]]:
    certs = pki[0]
    started = {
        "mtls": AdsServer(tls=TlsFiles(str(certs.server_cert), str(certs.server_key),
                                       str(certs.ca))).start(),
        "plaintext": AdsServer().start(),
    }
    for server in started.values():
        server.set_snapshot("1", [basic()])
    yield started
    for server in started.values():
        server.stop()


def failure(url: str, credentials: grpc.ChannelCredentials | None, san: str | None) -> str:
    """gRPC's details of one attempt to open rls's ADS stream (AssertionError if it works)."""

    async def attempt() -> str:
        options = [("grpc.ssl_target_name_override", san)] if san else []
        channel = (grpc.aio.secure_channel(url, credentials, options=options)
                   if credentials is not None else grpc.aio.insecure_channel(url))
        try:
            call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel).StreamAggregatedResources()
            await call.write(discovery_pb2.DiscoveryRequest())
            await asyncio.wait_for(call.read(), 10)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
            return exc.details() or ""
        finally:
            await channel.close()
        raise AssertionError("the stream opened")

    return asyncio.run(attempt())


def tls(ca: Path, cert: Certs | None) -> grpc.ChannelCredentials:
    if cert is None:
        return grpc.ssl_channel_credentials(ca.read_bytes())
    return grpc.ssl_channel_credentials(ca.read_bytes(), cert.client_key.read_bytes(),
                                        cert.client_cert.read_bytes())


CASES = {  # name: (server, our CA or the other's, client certificate ours/other/none, SAN)
    "wrong name": ("mtls", "ours", "ours", "other.example", problems.WRONG_NAME),
    "an IP the certificate lacks": ("mtls", "ours", "ours", None, problems.WRONG_NAME),
    "untrusted control plane": ("mtls", "other", "ours", SERVER_SAN, problems.UNTRUSTED),
    "plaintext control plane": ("plaintext", "ours", "ours", SERVER_SAN,
                                problems.PLAINTEXT_SERVER),
    "no client certificate": ("mtls", "ours", None, SERVER_SAN, problems.CLOSED_IN_HANDSHAKE),
    "client certificate from another CA": ("mtls", "ours", "other", SERVER_SAN,
                                           problems.CLOSED_IN_HANDSHAKE),
    "plaintext client, TLS control plane": ("mtls", None, None, None,
                                            problems.CLOSED_IN_HANDSHAKE),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_real_connection_failure_is_classified(
    case: str, servers: dict[str, AdsServer], pki: tuple[Certs, Certs]
) -> None:
    server, ca, cert, san, expected = CASES[case]
    certs = {"ours": pki[0], "other": pki[1]}
    credentials = None if ca is None else tls(
        certs[ca].ca, None if cert is None else certs[cert])
    assert classify(failure(servers[server].url, credentials, san)) == expected


def test_nothing_listening_and_an_unknown_host_are_classified() -> None:
    assert classify(failure(f"127.0.0.1:{free_port()}", None, None)) == problems.REFUSED
    assert classify(failure("no-such-host.invalid:18001", None, None)) == problems.UNRESOLVED
    assert classify("UNAVAILABLE: something new") is None


def test_explanations_name_what_to_change(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("xds_server_url", "xds_server_tls_san", "xds_client_tls_cert",
                 "xds_client_tls_key", "xds_server_use_tls", "xds_server_tls_cacert"):
        monkeypatch.delenv(f"RLS_{name.upper()}", raising=False)
        monkeypatch.delenv(REFERENCE_ENV[name], raising=False)
    monkeypatch.setenv("CONFIG_GRPC_XDS_SERVER_URL", "eg.example:18001")
    monkeypatch.setenv("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds.wrong")
    settings = Settings(xds_server_url="eg.example:18001", xds_server_use_tls=True,
                        xds_server_tls_san="xds.wrong", xds_client_tls_cert="/certs/tls.crt",
                        xds_client_tls_key="/certs/tls.key")
    said = explain(settings, problems.WRONG_NAME, "")
    assert "'xds.wrong' (CONFIG_GRPC_XDS_SERVER_TLS_SAN)" in said
    # a flag (no variable set) is named as the flag; an unset SAN is the URL's host
    monkeypatch.delenv("CONFIG_GRPC_XDS_SERVER_TLS_SAN")
    assert "(--xds-server-tls-san)" in explain(settings, problems.WRONG_NAME, "")
    settings.xds_server_tls_san = ""
    said = explain(settings, problems.WRONG_NAME, "")
    assert "'eg.example' (the host of CONFIG_GRPC_XDS_SERVER_URL): set " \
        "CONFIG_GRPC_XDS_SERVER_TLS_SAN to a DNS name" in said

    said = explain(settings, problems.CLOSED_IN_HANDSHAKE, "")
    assert "refused our client certificate /certs/tls.crt" in said
    assert "--xds-client-tls-cert" in said and "its CA" in said
    settings.xds_client_tls_cert = settings.xds_client_tls_key = ""
    said = explain(settings, problems.CLOSED_IN_HANDSHAKE, "")
    assert "requires a client certificate: set CONFIG_GRPC_XDS_CLIENT_TLS_CERT" in said
    said = explain(settings, problems.PLAINTEXT_SERVER, "")
    assert "speaks plaintext" in said and "unset --xds-server-use-tls" in said
    settings.xds_server_use_tls = False
    said = explain(settings, problems.CLOSED_IN_HANDSHAKE, "")
    assert "probably expects TLS: set CONFIG_GRPC_XDS_SERVER_USE_TLS=true" in said
    said = explain(settings, problems.UNTRUSTED, "…CERTIFICATE_VERIFY_FAILED: certificate has "
                   "expired: OK")
    assert "the system's CAs (CONFIG_GRPC_XDS_SERVER_TLS_CACERT unset): certificate has expired" \
        in said


# -- rls itself ----------------------------------------------------------------------------------


def rls_against(rls_factory: Callable[..., Any], server: AdsServer, certs: Certs,
                **env: str) -> Any:
    """rls with Envoy Gateway's mTLS variables pointed at `server` (force start: it serves
    meanwhile); `env` changes them, an empty value unsets one."""
    full = xds_env(server, FORCE_START_WITHOUT_INITIAL_CONFIG="true",
                   CONFIG_GRPC_XDS_SERVER_USE_TLS="true",
                   CONFIG_GRPC_XDS_SERVER_TLS_CACERT=str(certs.ca),
                   CONFIG_GRPC_XDS_SERVER_TLS_SAN=SERVER_SAN,
                   CONFIG_GRPC_XDS_CLIENT_TLS_CERT=str(certs.client_cert),
                   CONFIG_GRPC_XDS_CLIENT_TLS_KEY=str(certs.client_key))
    full.update(env)
    return rls_factory(env={k: v for k, v in full.items() if v})


def xds_warnings(log: str) -> list[str]:
    return [line for line in log.splitlines() if "WARNING rls.config.xds" in line]


RLS_CASES = {  # name: (server, env changes, what the log must say)
    "wrong name": ("mtls", {"CONFIG_GRPC_XDS_SERVER_TLS_SAN": "other.example"},
                   "does not carry the name 'other.example' (CONFIG_GRPC_XDS_SERVER_TLS_SAN)"),
    "plaintext control plane": ("plaintext", {},
                                "speaks plaintext, not TLS: unset CONFIG_GRPC_XDS_SERVER_USE_TLS"),
    "no client certificate": ("mtls", {"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "",
                                       "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": ""},
                              "requires a client certificate: set "
                              "CONFIG_GRPC_XDS_CLIENT_TLS_CERT / CONFIG_GRPC_XDS_CLIENT_TLS_KEY"),
    "missing client certificate file": (
        "mtls", {"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "/nonexistent/tls.crt"},
        "cannot read the client certificate /nonexistent/tls.crt "
        "(CONFIG_GRPC_XDS_CLIENT_TLS_CERT): No such file or directory"),
}


@pytest.mark.parametrize("case", list(RLS_CASES))
def test_rls_logs_what_to_fix_once_with_no_grpc_core_lines(
    case: str, servers: dict[str, AdsServer], pki: tuple[Certs, Certs],
    rls_factory: Callable[..., Any],
) -> None:
    server, env, said = RLS_CASES[case]
    rls = rls_against(rls_factory, servers[server], pki[0], **env)
    wait_until(lambda: metric(rls.http_url, "rls_xds_reconnects_total",
                              reason="connect_failed") >= 5, 20, "failed connects", rls.log)
    log = rls.log()
    warned = xds_warnings(log)
    assert len(warned) == 1, log  # again only after a minute
    assert said in warned[0], warned[0]
    assert "no config in force yet: every call is answered OK" in warned[0]
    assert "keeping the config in force" not in log
    assert not GRPC_CORE_LINE.findall(log), log  # grpc-core's own handshake lines
    error = rlconfig(rls)["source"]["last_stream_error"]
    assert said in error["error"] and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ",
                                                   error["at"]), error


def test_the_user_keeps_grpc_core_lines_by_setting_grpc_verbosity(
    servers: dict[str, AdsServer], pki: tuple[Certs, Certs], rls_factory: Callable[..., Any]
) -> None:
    """rls quiets grpc-core only when GRPC_VERBOSITY is unset: a user's own value stands."""
    rls = rls_against(rls_factory, servers["plaintext"], pki[0], GRPC_VERBOSITY="INFO")
    wait_until(lambda: "Handshake failed" in rls.log(), 20, "grpc-core's line", rls.log)


def test_stream_error_is_dated_and_moves_to_previous_once_connected(
    ads: AdsServer, xds_rls: Callable[..., Any]
) -> None:
    ads.stop()  # down at start
    rls = xds_rls(FORCE_START_WITHOUT_INITIAL_CONFIG="true")
    wait_until(lambda: rlconfig(rls)["source"]["last_stream_error"], 15, "a stream error")
    source = rlconfig(rls)["source"]
    assert "nothing accepts connections at" in source["last_stream_error"]["error"]
    assert source["last_stream_error"]["at"] and source["previous_stream_error"] is None

    ads.set_snapshot("1", [basic()])
    ads.start()
    ads.wait_ack("1")
    wait_until(lambda: rlconfig(rls)["source"]["last_stream_error"] is None, 10, "cleared")
    source = rlconfig(rls)["source"]
    assert source["connected"] is True
    previous = source["previous_stream_error"]
    assert "nothing accepts connections at" in previous["error"]
    assert previous["at"] <= previous["cleared_at"]


def test_without_force_start_the_retry_line_says_nothing_is_served_yet(
    xds_rls: Callable[..., Any]
) -> None:
    down = f"127.0.0.1:{free_port()}"
    rls = xds_rls(wait_healthy=False, CONFIG_GRPC_XDS_SERVER_URL=down)
    wait_until(lambda: xds_warnings(rls.log()), 15, "the retry line", rls.log)
    line = xds_warnings(rls.log())[0]
    assert "no config yet: rls opens its listeners once the first arrives" in line, line
    assert f"nothing accepts connections at {down} (CONFIG_GRPC_XDS_SERVER_URL)" in line, line
