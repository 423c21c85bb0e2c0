"""Certificates rotate without a restart: a Kubernetes-style Secret swap under load, and a
broken new pair that is refused while the old one stays in force."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from support.certs import CertAuthority, Issued, SecretMount
from support.waiting import wait_until

from .helpers import (
    EXAMPLE,
    Pki,
    channel,
    connects,
    der_of,
    metric,
    presented_certificate,
    should_rate_limit,
)

RELOADS = "rls_grpc_tls_reloads_total"
EXPIRY = "rls_grpc_tls_certificate_expiry_timestamp_seconds"


def _secret(mount: SecretMount, server: Issued, ca: CertAuthority) -> None:
    mount.write({"tls.crt": server.cert.read_bytes(), "tls.key": server.key.read_bytes(),
                 "ca.crt": ca.cert.read_bytes()})


def _start(rls_factory: Callable[..., Any], mount: SecretMount) -> Any:
    return rls_factory(EXAMPLE, args=(
        "--grpc-tls", "on", "--grpc-tls-cert", str(mount.path("tls.crt")),
        "--grpc-tls-key", str(mount.path("tls.key")),
        "--grpc-tls-client-ca", str(mount.path("ca.crt"))))


def _serving(rls_factory: Callable[..., Any], pki: Pki, tmp_path: Path) -> tuple[SecretMount, Any]:
    """rls serving gRPC TLS from a secret mount that holds the server pair and the CA."""
    mount = SecretMount(tmp_path / "certs")
    _secret(mount, pki.server, pki.ca)
    return mount, _start(rls_factory, mount)


class Load:
    """Calls on one established connection, back to back, in a thread; every outcome kept."""

    def __init__(self, ch: grpc.Channel) -> None:
        self.ch = ch
        self.ok = 0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                should_rate_limit(self.ch, user="load")
                self.ok += 1
            except grpc.RpcError as exc:
                self.errors.append(str(exc))

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(10)


def test_a_secret_swap_under_load_reaches_new_connections_and_keeps_established_ones(
    rls_factory: Callable[..., Any], pki: Pki, tmp_path: Path
) -> None:
    mount, rls = _serving(rls_factory, pki, tmp_path)
    renewed = pki.ca.issue("server-renewed")
    assert presented_certificate(rls.grpc_port, pki.ca.cert, pki.client) == der_of(pki.server.cert)
    with channel(rls.grpc_addr, pki.ca.cert, pki.client) as established, Load(established) as load:
        wait_until(lambda: load.ok >= 20, 10, "calls before the swap")
        _secret(mount, renewed, pki.ca)
        wait_until(
            lambda: presented_certificate(rls.grpc_port, pki.ca.cert, pki.client)
            == der_of(renewed.cert),
            10, "a new connection presenting the renewed certificate", log=rls.log)
        at_swap = load.ok
        wait_until(lambda: load.ok >= at_swap + 20, 10, "calls after the swap")
        with channel(rls.grpc_addr, pki.ca.cert, pki.client) as fresh:
            assert should_rate_limit(fresh) == 1
    assert load.errors == []
    assert rls.proc.poll() is None
    assert metric(rls.http_url, RELOADS, result="success") == 1
    assert "gRPC TLS files reloaded" in rls.log()


def test_a_broken_new_pair_is_refused_in_one_log_line_and_the_old_pair_stays(
    rls_factory: Callable[..., Any], pki: Pki, tmp_path: Path
) -> None:
    mount, rls = _serving(rls_factory, pki, tmp_path)
    expiry = metric(rls.http_url, EXPIRY, certificate="server")
    renewed = pki.ca.issue("server-renewed-2")
    # The renewed certificate with the old key: they do not match.
    mount.write({"tls.crt": renewed.cert.read_bytes(), "tls.key": pki.server.key.read_bytes(),
                 "ca.crt": pki.ca.cert.read_bytes()})
    wait_until(lambda: metric(rls.http_url, RELOADS, result="error") == 1, 10,
               "the broken pair refused", log=rls.log)
    assert presented_certificate(rls.grpc_port, pki.ca.cert, pki.client) == der_of(pki.server.cert)
    with channel(rls.grpc_addr, pki.ca.cert, pki.client) as ch:
        assert should_rate_limit(ch) == 1
    assert rls.log().count("not loaded, the previous ones stay in force") == 1
    assert "does not match the certificate" in rls.log()
    assert metric(rls.http_url, EXPIRY, certificate="server") == expiry
    # Fixed: the good pair is taken.
    _secret(mount, renewed, pki.ca)
    wait_until(
        lambda: presented_certificate(rls.grpc_port, pki.ca.cert, pki.client)
        == der_of(renewed.cert), 10, "the fixed pair in force", log=rls.log)
    assert metric(rls.http_url, RELOADS, result="success") == 1


def test_an_already_expired_renewal_is_refused_and_the_valid_pair_stays(
    rls_factory: Callable[..., Any], pki: Pki, tmp_path: Path
) -> None:
    """A stale certificate copied in as the renewal would fail every new handshake while the
    one in force is still good: it is refused in one line, as a broken pair is."""
    mount, rls = _serving(rls_factory, pki, tmp_path)
    stale = pki.ca.issue("server-stale", expired=True)
    _secret(mount, stale, pki.ca)
    wait_until(lambda: metric(rls.http_url, RELOADS, result="error") == 1, 10,
               "the expired renewal refused", log=rls.log)
    assert presented_certificate(rls.grpc_port, pki.ca.cert, pki.client) == der_of(pki.server.cert)
    assert rls.log().count("the new certificate expired at 2020-01-02 00:00 UTC") == 1


def test_a_new_client_ca_decides_who_new_connections_admit(
    rls_factory: Callable[..., Any], pki: Pki, tmp_path: Path
) -> None:
    mount, rls = _serving(rls_factory, pki, tmp_path)
    other_ca = pki.stranger.cert.parent / "ca.crt"  # the CA that issued `stranger`
    with channel(rls.grpc_addr, pki.ca.cert, pki.stranger) as ch:
        assert not connects(ch, timeout=1.0)
    mount.write({"tls.crt": pki.server.cert.read_bytes(), "tls.key": pki.server.key.read_bytes(),
                 "ca.crt": other_ca.read_bytes()})

    def admitted(client: Issued) -> bool:
        with channel(rls.grpc_addr, pki.ca.cert, client) as ch:
            return connects(ch, timeout=1.0)

    wait_until(lambda: admitted(pki.stranger), 10, "the new CA's client admitted", log=rls.log)
    assert not admitted(pki.client)  # the old CA's client: refused on a new connection
