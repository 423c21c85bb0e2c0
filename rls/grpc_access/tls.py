"""TLS and mTLS on every gRPC listener, with certificates that rotate without a restart.

grpcio does the TLS: each listener gets `grpc.dynamic_ssl_server_credentials`, whose fetcher
grpc calls before every new connection's handshake. The fetcher hands over a new certificate
configuration only after `watch` loaded and checked one, so a handshake costs no file access;
established connections keep the pair they were made with.

Files are re-read when their directory changes (watchfiles; that includes Kubernetes swapping
a mounted Secret's `..data` symlink) and at least every POLL_SECONDS (volumes without inotify).
A new set that does not load (unreadable, not PEM, key not matching the certificate) is refused
with one log line and the set in force stays; at start the same problem ends `rls serve` with
exit 2 naming the file (rls.cli.serve.startup_problem).

Client certificates (a client CA set) are required and verified in the handshake, so a client
without one, with one from another CA or expired is refused before any call. grpc cannot check
a SAN in the handshake: with a required SAN every call but health checks the peer's certificate
(grpc's auth context) and one without that SAN is refused UNAUTHENTICATED, and counted
(tls_refusals.py). A failed handshake is the client's to count (Envoy's cluster stats).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import grpc
import watchfiles
from cryptography import x509
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from prometheus_client import CollectorRegistry, Counter, Gauge

from rls.grpc_access.tls_refusals import REASONS, guarded
from rls.settings import Settings
from rls.settings.environment import REFERENCE_ENV, REFERENCE_ENV_FALLBACK, env_source

log = logging.getLogger("rls.tls")

POLL_SECONDS = 10.0  # re-read the files this often even without a change notice
RELOAD_RESULTS = ("success", "error")
# Settings field -> what the file is, for messages.
FILES = {
    "grpc_tls_cert": "certificate",
    "grpc_tls_key": "private key",
    "grpc_tls_client_ca": "client CA",
}


class TlsFileError(ValueError):
    """A TLS file that cannot be used; the message names the file and where it was set."""


@dataclass(frozen=True, slots=True)
class KeyMaterial:
    """One checked set of files: what grpc gets, and the dates the metrics show."""

    cert: bytes
    key: bytes
    client_ca: bytes | None
    cert_expiry: float  # unix seconds
    client_ca_expiry: float | None

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(self.key, self.cert)], root_certificates=self.client_ca
        )


def source(name: str) -> str:
    """Where a file setting is given: the flag, and the environment variable if one is set."""
    found = env_source(name)
    flag = "--" + name.replace("_", "-")
    return f"{flag} / {found[0]}" if found is not None else flag


def _read(settings: Settings, name: str) -> bytes:
    path = getattr(settings, name)
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20)  # a certificate chain is a few KiB; bounded all the same
    except OSError as exc:
        raise TlsFileError(
            f"gRPC TLS {FILES[name]} {path} ({source(name)}): {exc.strerror or exc}"
        ) from None


def _certificates(settings: Settings, name: str, data: bytes) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise TlsFileError(
            f"gRPC TLS {FILES[name]} {getattr(settings, name)} ({source(name)}): "
            f"not a PEM certificate: {exc}"
        ) from None
    return certs


def _expiry(cert: x509.Certificate) -> float:
    return cert.not_valid_after_utc.timestamp()


def load_material(settings: Settings) -> KeyMaterial:
    """Read and check the files (certificate and key match; every file is PEM).

    Raises TlsFileError naming the first file that is missing, unreadable or wrong."""
    cert, key = _read(settings, "grpc_tls_cert"), _read(settings, "grpc_tls_key")
    chain = _certificates(settings, "grpc_tls_cert", cert)
    try:
        private = load_pem_private_key(key, password=None)
    except (ValueError, TypeError) as exc:  # TypeError: an encrypted key
        raise TlsFileError(
            f"gRPC TLS private key {settings.grpc_tls_key} ({source('grpc_tls_key')}): "
            f"not an unencrypted PEM private key: {exc}"
        ) from None
    if private.public_key() != chain[0].public_key():
        raise TlsFileError(
            f"gRPC TLS private key {settings.grpc_tls_key} ({source('grpc_tls_key')}) does "
            f"not match the certificate {settings.grpc_tls_cert}"
        )
    client_ca: bytes | None = None
    ca_expiry: float | None = None
    if settings.grpc_tls_client_ca:
        client_ca = _read(settings, "grpc_tls_client_ca")
        ca_expiry = min(
            _expiry(c) for c in _certificates(settings, "grpc_tls_client_ca", client_ca)
        )
    return KeyMaterial(cert, key, client_ca, _expiry(chain[0]), ca_expiry)


def startup_problem(settings: Settings) -> str | None:
    """Why TLS cannot start (one line naming the file), None when it can or is off."""
    if not settings.grpc_tls:
        return None
    try:
        load_material(settings)
    except TlsFileError as exc:
        return str(exc)
    return None


class TlsMetrics:
    """The loaded certificates' expiry, reloads, and refused clients by reason."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.expiry = Gauge(
            "rls_grpc_tls_certificate_expiry_timestamp_seconds",
            "Expiry (unix seconds) of the gRPC TLS certificate in force (certificate=server) "
            "and of the earliest client CA certificate (certificate=client_ca)",
            ["certificate"],
            registry=registry,
            # live: a worker that died before a rotation must not keep the old date on show
            multiprocess_mode="livemin",
        )
        self.reloads = Counter(
            "rls_grpc_tls_reloads",
            "Changed gRPC TLS files loaded (success) or refused, the old set kept (error)",
            ["result"],
            registry=registry,
        )
        self.refused = Counter(
            "rls_grpc_tls_refused",
            "gRPC calls refused by TLS: a client certificate without the required SAN "
            "(wrong_san); failed handshakes are counted by the client",
            ["reason"],
            registry=registry,
        )
        for result in RELOAD_RESULTS:
            self.reloads.labels(result)
        for reason in REASONS:
            self.refused.labels(reason)

    def show(self, material: KeyMaterial) -> None:
        self.expiry.labels("server").set(material.cert_expiry)
        if material.client_ca_expiry is not None:
            self.expiry.labels("client_ca").set(material.client_ca_expiry)


class _Fetcher:
    """grpc's certificate-configuration fetcher for one listener: called (on a grpc thread)
    before each handshake; a new configuration once per loaded set, else None (no change)."""

    def __init__(self, tls: GrpcTls) -> None:
        self.tls = tls
        self.version = tls.version

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        tls = self.tls
        if tls.version == self.version:
            return None
        self.version = tls.version
        return tls.configuration


class GrpcTls:
    """The TLS state shared by every gRPC listener of one process."""

    def __init__(self, settings: Settings, registry: CollectorRegistry) -> None:
        self.settings = settings
        self.metrics = TlsMetrics(registry)
        self.material = load_material(settings)  # TlsFileError: cli checked it, rare here
        self.configuration = self.material.configuration()
        self.version = 1
        self._refused_key: tuple[bytes, ...] | None = None  # the refused set, logged once
        self.metrics.show(self.material)

    @property
    def mutual(self) -> bool:
        return self.material.client_ca is not None

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials for one listener (its own fetcher, the shared files)."""
        return grpc.dynamic_ssl_server_credentials(
            self.configuration, _Fetcher(self), require_client_authentication=self.mutual
        )

    def guard(
        self, handlers: tuple[grpc.GenericRpcHandler, ...]
    ) -> tuple[grpc.GenericRpcHandler, ...]:
        """`handlers`, refusing calls without the required SAN when one is set."""
        san = self.settings.grpc_tls_client_san
        return guarded(handlers, san, self.metrics.refused.labels("wrong_san")) if san else handlers

    def describe(self) -> str:
        """The start-up line: what is served and what is required of clients."""
        s, m = self.settings, self.material
        expires = datetime.fromtimestamp(m.cert_expiry, UTC).strftime("%Y-%m-%d %H:%M UTC")
        text = f"gRPC TLS on every listener: certificate {s.grpc_tls_cert} (expires {expires})"
        if not self.mutual:
            return text + "; client certificates not required"
        text += f"; client certificates required, CA {s.grpc_tls_client_ca}"
        if s.grpc_tls_client_san:
            text += f", SAN {s.grpc_tls_client_san!r} (checked at each call)"
        found = env_source("grpc_tls_client_ca")
        if found is not None and found[0] == REFERENCE_ENV_FALLBACK["grpc_tls_client_ca"]:
            text += (f" (from Envoy Gateway's {found[0]}, honoured as the client CA, unlike "
                     f"the reference, which reads only {REFERENCE_ENV['grpc_tls_client_ca']}; "
                     "set RLS_GRPC_TLS_CLIENT_CA= to not require client certificates)")
        return text

    def reload(self) -> bool:
        """Re-read the files; True when a new set is in force. A set that fails is logged
        once (until the files change again) and the one in force stays."""
        try:
            material = load_material(self.settings)
            self._refuse_expired(material)
        except TlsFileError as exc:
            key = tuple(_peek(getattr(self.settings, name)) for name in FILES)
            if key != self._refused_key:
                self._refused_key = key
                self.metrics.reloads.labels("error").inc()
                log.error("gRPC TLS files changed but not loaded, the previous ones stay in "
                          "force: %s", exc)
            return False
        self._refused_key = None
        if material == self.material:
            return False
        self.material = material
        self.configuration = material.configuration()
        self.version += 1  # the fetchers hand it to grpc at their next handshake
        self.metrics.show(material)
        self.metrics.reloads.labels("success").inc()
        log.info("gRPC TLS files reloaded: new connections use certificate %s (expires %s)",
                 self.settings.grpc_tls_cert,
                 time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(material.cert_expiry)))
        return True

    def _refuse_expired(self, material: KeyMaterial) -> None:
        """A renewal that is already expired (a stale file copied in) would make every new
        handshake fail while the certificate in force still works: refuse it. When the one in
        force has expired too, the new one is no worse and is taken."""
        now = time.time()
        if material.cert_expiry <= now < self.material.cert_expiry:
            raise TlsFileError(
                f"{self.settings.grpc_tls_cert}: the new certificate expired at "
                f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(material.cert_expiry))}, "
                "the one in force has not"
            )

    def directories(self) -> list[str]:
        """The directories holding the files (a Kubernetes Secret's mount point, not the
        `..data` directory behind the symlinks, which is replaced on every update)."""
        dirs = {os.path.dirname(os.path.abspath(getattr(self.settings, name)))
                for name in FILES if getattr(self.settings, name)}
        return sorted(dirs)

    async def watch(self, poll: float = POLL_SECONDS) -> None:
        """Reload on every change in the files' directories, and every `poll` seconds."""
        dirs = self.directories()
        while True:
            try:
                async for _changes in watchfiles.awatch(
                    *dirs, watch_filter=None, recursive=False, debounce=200, step=50,
                    rust_timeout=int(poll * 1000), yield_on_timeout=True,
                    ignore_permission_denied=True,
                ):
                    self.reload()
            except (OSError, RuntimeError) as exc:  # a directory gone; poll until it is back
                log.warning("watching %s for TLS file changes failed (%s); polling every "
                            "%g s", ", ".join(dirs), exc, poll)
                self.reload()
                await asyncio.sleep(poll)


def _peek(path: str) -> bytes:
    """A file's bytes, or b"" when unreadable: what makes a refused set recognisable."""
    if not path:
        return b""
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20)
    except OSError:
        return b""


def start_tls(settings: Settings, registry: CollectorRegistry) -> GrpcTls | None:
    """The process's TLS state, None when gRPC TLS is off (a start-up line either way when
    TLS settings are given)."""
    if not settings.grpc_tls:
        ignored = [name for name in FILES if getattr(settings, name)]
        if ignored:
            log.warning("gRPC TLS is off (--grpc-tls, GRPC_SERVER_USE_TLS): %s ignored",
                        ", ".join(source(name) for name in ignored))
        return None
    try:
        tls = GrpcTls(settings, registry)
    except TlsFileError as exc:  # changed since `rls serve`'s start-up check read them
        raise SystemExit(f"rls: {exc}") from None
    log.info("%s", tls.describe())
    return tls


def add_port(server: grpc.aio.Server, addr: str, tls: GrpcTls | None) -> int:
    """Bind `addr` on `server`: TLS (its own credentials) when on, plaintext otherwise."""
    if tls is None:
        return int(server.add_insecure_port(addr))
    return int(server.add_secure_port(addr, tls.credentials()))
