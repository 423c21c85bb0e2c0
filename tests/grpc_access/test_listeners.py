"""TLS and mTLS on every gRPC listener of a real `rls serve`: the main port (RateLimitService,
RLQS, counters, health) and ext_proc's own listener. Certificates are made by openssl."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.certs import Issued

from rls.grpc_access.tls_refusals import handshake_reason

from .helpers import (
    EXAMPLE,
    ROOT,
    Pki,
    channel,
    connects,
    extproc_code,
    health,
    metric,
    should_rate_limit,
)

CACHE = ROOT / "config" / "cache.yaml"
TOKEN = "s3cret-token"
REFUSED = "rls_grpc_tls_refused_total"


@pytest.fixture
def mtls_rls(rls_factory: Callable[..., Any], pki: Pki) -> Any:
    """rls with mTLS (client CA and SAN), the token, and ext_proc on its own listener."""
    return rls_factory(EXAMPLE, args=(*pki.server_args(), "--cache-config", str(CACHE)),
                       env={"RLS_GRPC_TOKEN": TOKEN})


def _addrs(rls: Any) -> dict[str, str]:
    return {"main": rls.grpc_addr, "ext_proc": rls.extproc_addr}


def test_a_client_with_a_good_certificate_is_served_on_every_listener_and_the_token_applies(
    mtls_rls: Any, pki: Pki
) -> None:
    with channel(mtls_rls.grpc_addr, pki.ca.cert, pki.client) as ch:
        assert should_rate_limit(ch, TOKEN) == 1  # OK
        assert health(ch) == 1  # SERVING (health needs no token)
        with pytest.raises(grpc.RpcError) as refused:
            should_rate_limit(ch)  # a good certificate does not replace the token
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with channel(mtls_rls.extproc_addr, pki.ca.cert, pki.client) as ch:
        assert extproc_code(ch, TOKEN) == grpc.StatusCode.OK
        assert extproc_code(ch) == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize(("kind", "reason"), [
    ("plaintext", "not_tls"),
    ("no_certificate", "no_certificate"),
    ("stranger", "untrusted"),
    ("expired", "expired"),
])
def test_a_client_without_a_good_certificate_is_refused_at_the_handshake_on_every_listener(
    mtls_rls: Any, pki: Pki, kind: str, reason: str
) -> None:
    client: Issued | None = {"stranger": pki.stranger, "expired": pki.expired}.get(kind)
    ca = None if kind == "plaintext" else pki.ca.cert
    for name, addr in _addrs(mtls_rls).items():
        before = metric(mtls_rls.http_url, REFUSED, reason=reason)
        with channel(addr, ca, client) as ch:
            assert not connects(ch, timeout=2.0), f"{name}: {kind} client got a connection"
            with pytest.raises(grpc.RpcError) as refused:
                should_rate_limit(ch, TOKEN, timeout=2.0)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, name
        assert metric(mtls_rls.http_url, REFUSED, reason=reason) > before, (
            f"{name}: no {reason} refusal counted\n{mtls_rls.log()}")


def test_a_certificate_without_the_required_san_is_refused_unauthenticated_at_each_call(
    mtls_rls: Any, pki: Pki
) -> None:
    before = metric(mtls_rls.http_url, REFUSED, reason="wrong_san")
    with channel(mtls_rls.grpc_addr, pki.ca.cert, pki.wrong_san) as ch:
        assert connects(ch)  # grpc cannot check a SAN in the handshake
        for _ in range(2):  # every call, not only the first
            with pytest.raises(grpc.RpcError) as refused:
                should_rate_limit(ch, TOKEN)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "SAN" in (refused.value.details() or "")
        assert health(ch) == 1  # health stays open, as with the token (probes)
    with channel(mtls_rls.extproc_addr, pki.ca.cert, pki.wrong_san) as ch:
        assert extproc_code(ch, TOKEN) == grpc.StatusCode.UNAUTHENTICATED
    assert metric(mtls_rls.http_url, REFUSED, reason="wrong_san") == before + 3


def test_tls_without_a_client_ca_serves_clients_without_a_certificate(
    rls_factory: Callable[..., Any], pki: Pki
) -> None:
    rls = rls_factory(EXAMPLE, args=("--grpc-tls", "on", "--grpc-tls-cert", str(pki.server.cert),
                                     "--grpc-tls-key", str(pki.server.key)))
    with channel(rls.grpc_addr, pki.ca.cert) as ch:
        assert should_rate_limit(ch) == 1
    with channel(rls.grpc_addr, None) as ch:
        assert not connects(ch, timeout=2.0)  # TLS all the same
    assert metric(rls.http_url, "rls_grpc_tls_certificate_expiry_timestamp_seconds",
                  certificate="server") > 1.7e9


def test_envoy_gateway_environment_serves_mtls_with_its_ca_as_the_client_ca(
    rls_factory: Callable[..., Any], pki: Pki
) -> None:
    """Envoy Gateway sets GRPC_SERVER_USE_TLS, _CERT, _KEY and GRPC_SERVER_TLS_CA_CERT (a name
    the reference never reads): rls requires client certificates from that CA, and says so."""
    rls = rls_factory(EXAMPLE, env={
        "GRPC_SERVER_USE_TLS": "true",
        "GRPC_SERVER_TLS_CERT": str(pki.server.cert),
        "GRPC_SERVER_TLS_KEY": str(pki.server.key),
        "GRPC_SERVER_TLS_CA_CERT": str(pki.ca.cert),
    })
    with channel(rls.grpc_addr, pki.ca.cert, pki.client) as ch:
        assert should_rate_limit(ch) == 1
    with channel(rls.grpc_addr, pki.ca.cert) as ch:
        assert not connects(ch, timeout=2.0)
    assert "client certificates required" in rls.log()
    assert "from Envoy Gateway's GRPC_SERVER_TLS_CA_CERT" in rls.log()


@pytest.mark.process
@pytest.mark.parametrize("broken", ["cert", "key", "client_ca", "mismatch", "not_pem"])
def test_a_missing_or_wrong_file_at_start_exits_2_naming_the_file(
    tmp_path: Path, pki: Pki, broken: str
) -> None:
    files = {"cert": pki.server.cert, "key": pki.server.key, "client_ca": pki.ca.cert}
    named = tmp_path / "nothing-here.pem"
    if broken == "mismatch":
        files["key"], named = pki.client.key, pki.client.key
    elif broken == "not_pem":
        named.write_text("not a certificate\n")
        files["cert"] = named
    else:
        files[broken] = named
    done = subprocess.run(
        [sys.executable, "-m", "rls", "serve", "--config", str(EXAMPLE), "--grpc-tls", "on",
         *(arg for name, path in files.items()
           for arg in (f"--grpc-tls-{name.replace('_', '-')}", str(path)))],
        capture_output=True, text=True, timeout=60, cwd=str(ROOT),
    )
    assert done.returncode == 2, done.stderr
    assert str(named) in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize(("line", "reason"), [
    (b"I1128 ssl_transport_security.cc:2563] Handshake failed with error SSL_ERROR_SSL: "
     b"error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: "
     b"unsupported certificate purpose", "wrong_usage"),
    (b"Handshake failed with error SSL_ERROR_SSL: error:10000412:SSL routines:"
     b"OPENSSL_internal:SSLV3_ALERT_BAD_CERTIFICATE", "other"),
    (b"I1128 some other grpc line", None),
])
def test_grpc_handshake_lines_map_to_reasons(line: bytes, reason: str | None) -> None:
    assert handshake_reason(line) == reason


def test_rls_with_tls_drains_on_sigterm_and_its_last_log_lines_still_reach_stderr(
    rls_factory: Callable[..., Any], pki: Pki
) -> None:
    """stderr passes through rls's pipe (handshake counting): nothing written at exit is lost."""
    rls = rls_factory(EXAMPLE, args=pki.server_args(san=False))
    with channel(rls.grpc_addr, None) as ch:
        assert not connects(ch, timeout=1.0)  # one grpc handshake line through the pipe
    assert rls.stop() == 0
    log = rls.log()
    assert "WRONG_VERSION_NUMBER" in log
    assert log.rstrip().endswith("stopped"), log[-500:]


FAILING_COUNTER = """
import os
from rls.grpc_access.tls_refusals import HandshakeLog

class Broken:  # a counter that fails, as a multiprocess metrics file on a full disk does
    def labels(self, reason):
        raise OSError(28, "No space left on device")

log = HandshakeLog(Broken())
log.install()
line = (b"I1128 05:17:15.886958 1 ssl_transport_security.cc:2563] Handshake failed with error "
        b"SSL_ERROR_SSL: error:100000c0:SSL routines:OPENSSL_internal:"
        b"PEER_DID_NOT_RETURN_A_CERTIFICATE: Invalid certificate verification context\\n")
for _ in range(4000):  # some 600 KB: far more than a pipe holds
    os.write(2, line)
log.uninstall()
print("done")
"""


def test_stderr_keeps_flowing_when_counting_a_handshake_failure_fails() -> None:
    """The pipe in front of stderr must never stop draining: a dead pump would block every
    later write to stderr (rls's own log lines) once the pipe is full, hanging the server."""
    done = subprocess.run([sys.executable, "-c", FAILING_COUNTER], capture_output=True,
                          timeout=30, check=False)
    assert done.stdout.strip() == b"done"
    assert done.stderr.count(b"Handshake failed") == 4000


@pytest.mark.parametrize("verbosity", ["ERROR", "none"])
def test_tls_on_with_grpc_logging_quieted_says_at_start_that_handshakes_are_not_counted(
    pki: Pki, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, verbosity: str
) -> None:
    """The handshake refusals are counted from grpc's INFO lines: with GRPC_VERBOSITY above
    INFO the counts stay 0, which must not pass for "nobody was refused"."""
    from prometheus_client import CollectorRegistry

    from rls.grpc_access.tls import start_tls
    from rls.settings import Settings

    monkeypatch.setenv("GRPC_VERBOSITY", verbosity)
    settings = Settings(grpc_tls=True, grpc_tls_cert=str(pki.server.cert),
                        grpc_tls_key=str(pki.server.key), grpc_tls_client_ca=str(pki.ca.cert))
    tls = start_tls(settings, CollectorRegistry())
    assert tls is not None
    tls.close()
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("GRPC_VERBOSITY" in m and "not counted" in m for m in warned), warned


FORCED_EXIT = """
import logging, sys
from prometheus_client import CollectorRegistry, Counter
from rls.grpc_access.tls_refusals import HandshakeLog
from rls.process.server import _shutdown_overran
logging.basicConfig(stream=sys.stderr, level=logging.INFO)
HandshakeLog(Counter("c", "c", ["reason"], registry=CollectorRegistry())).install()
_shutdown_overran()
"""


def test_the_last_line_before_a_forced_exit_still_reaches_stderr_through_the_tls_pipe() -> None:
    """os._exit skips atexit: the line saying why rls exits must leave the pipe first (it was
    lost most of the time). Three runs, as the loss was a race."""
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", FORCED_EXIT], capture_output=True,
                              timeout=30, check=False)
        assert done.returncode == 1
        assert b"shutdown did not finish in time" in done.stderr
