"""TLS and mTLS on every gRPC listener of a real `rls serve`: the main port (RateLimitService,
RLQS, counters, health) and ext_proc's own listener. Certificates are made by openssl."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.certs import Issued

from .helpers import (
    EXAMPLE,
    ROOT,
    Pki,
    channel,
    connects,
    extproc_code,
    health,
    metric,
    samples,
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
        assert extproc_code(ch, "not-it") == grpc.StatusCode.UNAUTHENTICATED
    assert samples(mtls_rls.http_url, "rls_grpc_token_refused_total") == {
        "missing": 2, "wrong": 1}  # one counter for both listeners


@pytest.mark.parametrize("kind", ["plaintext", "no_certificate", "stranger", "expired"])
def test_a_client_without_a_good_certificate_is_refused_at_the_handshake_on_every_listener(
    mtls_rls: Any, pki: Pki, kind: str
) -> None:
    """Refused before any call; the client counts that failed handshake (Envoy: its cluster's
    ssl.connection_error), not rls: grpc's log line for it cannot be told from rls's own
    failed connections, so rls's refusal counter does not move."""
    client: Issued | None = {"stranger": pki.stranger, "expired": pki.expired}.get(kind)
    ca = None if kind == "plaintext" else pki.ca.cert
    for name, addr in _addrs(mtls_rls).items():
        with channel(addr, ca, client) as ch:
            assert not connects(ch, timeout=2.0), f"{name}: {kind} client got a connection"
            with pytest.raises(grpc.RpcError) as refused:
                should_rate_limit(ch, TOKEN, timeout=2.0)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, name
    assert samples(mtls_rls.http_url, REFUSED) == {"wrong_san": 0}


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


def test_rls_with_tls_writes_to_the_stderr_it_was_given_and_drains_on_sigterm(
    rls_factory: Callable[..., Any], pki: Pki
) -> None:
    """Nothing stands between rls and its stderr (no pipe, no thread): a crash's last words,
    grpc-core's own lines (asked for with GRPC_VERBOSITY=INFO: rls sets ERROR when it is unset)
    and every log line reach the file rls was started with."""
    rls = rls_factory(EXAMPLE, args=pki.server_args(san=False), env={"GRPC_VERBOSITY": "INFO"})
    with channel(rls.grpc_addr, None) as ch:
        assert not connects(ch, timeout=1.0)  # grpc-core logs the failed handshake
    assert os.path.samefile(f"/proc/{rls.proc.pid}/fd/2", rls.log_path)
    assert rls.stop() == 0
    log = rls.log()
    assert "WRONG_VERSION_NUMBER" in log
    assert log.rstrip().endswith("stopped"), log[-500:]
