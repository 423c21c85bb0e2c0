"""`Settings`: every setting rls has, its default and why, and the rules its values must
follow (`validate`: one SettingError naming the setting, which the command line turns into the
flag or variable the value came from).

The values come from flags (rls.cli.serve) and the environment (rls.settings.environment):
flag > RLS_* variable > envoyproxy/ratelimit's variable > default.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from dataclasses import dataclass, field

from rls.event_loop import uvloop_installed
from rls.settings.environment import admin_token, env_with_prefix
from rls.settings.forms import parse_pairs, stream_headers
from rls.stores.memory import DEFAULT_MAX_BYTES
from rls.stores.redis.urls import bare_url_problem, normalize_redis_url, redact, url_problem

GRPC_ADDRS = ("grpc_addr", "extproc_addr")  # the listeners that also take unix: paths

URL_SCHEMES: dict[str, tuple[str, ...]] = {
    "redis_url": (
        "redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel", "redis+cluster",
        "rediss+cluster",
    ),
    "cache_store": (
        "redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel", "redis+cluster",
        "rediss+cluster", "ssdb", "memory",
    ),
}


# The reference's (logrus) level names that have a Python equivalent.
LOG_LEVEL_ALIASES = {"warn": "warning", "trace": "debug", "fatal": "critical", "panic": "critical"}

# What answers a call the store could not decide (--failure-mode, a domain's `failure_mode`):
# allow (OK), deny (OVER_LIMIT), or error (gRPC UNAVAILABLE, so that the caller's own failure
# mode decides: Envoy's failure_mode_deny / Envoy Gateway's failClosed).
FAILURE_MODES = ("allow", "deny", "error")

# Closed sets of values, and lower bounds, checked by Settings.validate.
CHOICES: dict[str, tuple[str, ...]] = {
    "failure_mode": FAILURE_MODES,
    "log_format": ("text", "json"),
    "loop": ("auto", "uvloop", "asyncio"),
    "log_level": ("debug", "info", "warning", "error", "critical"),
    "config_type": ("FILE", "GRPC_XDS_SOTW"),
    "tracing_protocol": ("http", "grpc"),
}
MINIMUM: dict[str, float] = {
    "workers": 1,
    "worker_max_failures": 1,
    "backend_timeout_ms": 1,
    "breaker_threshold": 1,
    "probe_interval_ms": 1,
    "probe_timeout_ms": 1,
    "overload_cap_ms": 1,
    "max_inflight": 1,
    "memory_max_bytes": 1 << 20,
    "deadline_margin_ms": 0,
    "reload_interval": 0,
    "shutdown_delay_ms": 0,
    "drain_seconds": 0,
    "max_descriptors": 1,
    "max_entries": 1,
    "max_value_bytes": 1,
    "max_request_bytes": 1,
    "decision_log_max_bytes": 1024,
    "max_concurrent_streams": 1,
    "xds_connect_retry_interval": 0.001,
    "xds_backoff_initial": 0.001,
    "xds_backoff_max": 0.001,
    "xds_backoff_random_factor": 0,
    "xds_max_msg_bytes": 0,
}
# Upper bounds, checked by Settings.validate like MINIMUM: a huge value is a typo, and past a
# C int grpc's channel arguments overflow (a traceback), a socket timeout or a sleep overflows
# (a probe thread that never returns, so SIGTERM hangs) and `--workers` allocates a slot per
# worker before starting any. Settings of MINIMUM not named here are capped at INT32_MAX.
INT32_MAX = 2**31 - 1
MAXIMUM: dict[str, float] = {
    "workers": 1024,
    "memory_max_bytes": 1 << 50,
    "decision_log_max_bytes": 1 << 50,
    "max_request_bytes": 256 << 20,  # grpc's own ceiling is 4 x this + 64 KiB, a C int
    "reload_interval": 86400,
    "drain_seconds": 86400,
    "xds_connect_retry_interval": 86400,
    "xds_backoff_initial": 86400,
    "xds_backoff_max": 86400,
}
# Settings given as durations: seconds, or Go's forms (`10s`, `1m30s`, `500ms`), as the
# reference's variables are written (rls.settings.forms.parse_duration).
DURATIONS = frozenset(
    {"xds_connect_retry_interval", "xds_backoff_initial", "xds_backoff_max"}
)


@dataclass(slots=True)
class Settings:
    config: list[str] = field(default_factory=list)
    grpc_addr: str = "0.0.0.0:8081"
    http_addr: str = "127.0.0.1:8080"
    redis_url: str = ""
    # rediss:// to --redis-url (any topology): a client certificate and key for a Redis that
    # requires one, the CA of its certificate, and whether its host name is left unchecked.
    redis_tls_client_cert: str = ""
    redis_tls_client_key: str = ""
    redis_tls_cacert: str = ""
    redis_tls_skip_hostname_verification: bool = False
    cache_config: str = ""
    cache_store: str = ""  # redis://, ssdb://…; default: the rules file's `store:`
    workers: int = 1
    # --workers > 1: consecutive failures of one worker slot before the supervisor exits 1
    worker_max_failures: int = 10
    failure_mode: str = "allow"  # allow | deny | error when the store cannot decide in time
    # Store-time budget of one decision when the caller sends no deadline (Envoy sends its
    # filter timeout as the gRPC deadline, and that is used instead, less deadline_margin_ms).
    # Time this process itself lags (GC, CPU contention) is not counted: see stores/deadline.py.
    backend_timeout_ms: int = 50
    deadline_margin_ms: int = 3  # kept from the caller's deadline for answering (or 10 %)
    # A call still undecided after this long (wall clock) means rls is overloaded: UNAVAILABLE.
    overload_cap_ms: int = 1000
    max_inflight: int = 4096  # concurrent decisions per process; beyond: RESOURCE_EXHAUSTED
    # Memory store (no --redis-url): estimated bytes of its counters before the least recently
    # used are evicted. 64 MiB (~200,000 counters) fits the Helm chart's 256 Mi pod limit.
    memory_max_bytes: int = DEFAULT_MAX_BYTES
    # Share of each limit a process may grant on its own while the backend is away (0 = off,
    # the failure mode answers instead). With N replicas, 1/N keeps the total near the limit.
    fallback_share: float = 0.0
    # Answer keys known to be over limit locally until their reset (Redis only; 0 round trips).
    local_cache: bool = True
    auto_pipeline: bool = True  # concurrent Redis calls of a worker share one round trip
    # Decide hot plain fixed windows from tokens leased from Redis (rls/stores/redis/leases.py).
    redis_leases: bool = False
    breaker_threshold: int = 3  # consecutive connection errors that open the circuit
    probe_interval_ms: int = 100  # open circuit: PING the store this often; closes on success
    probe_timeout_ms: int = 200  # a probe PING slower than this counts as failed
    log_format: str = "text"
    # The event loop: uvloop where installed (a dependency on Linux), else asyncio's own.
    loop: str = "auto"
    log_level: str = "info"
    shadow_mode: bool = False  # global: OVER_LIMIT answered as OK (reference SHADOW_MODE)
    quota_mode: bool = False  # every descriptor is a quota (reference QUOTA_MODE)
    limiting_off: bool = False  # degradation switch: always OK, metrics still recorded
    shadow_domains: set[str] = field(default_factory=set)  # per-domain shadow switch
    merge_domains: bool = False
    near_limit_ratio: float = 0.8
    key_prefix: str = "rl:"
    reload_interval: float = 1.0
    shutdown_delay_ms: int = 1000  # after SIGTERM: keep serving (readiness 503) this long
    drain_seconds: float = 5.0  # then: stop accepting, wait at most this for in-flight calls
    max_descriptors: int = 64
    max_entries: int = 32
    max_value_bytes: int = 1024
    max_request_bytes: int = 1024 * 1024
    response_headers: bool = False  # RateLimit-* headers in response_headers_to_add
    # Their names (the reference's LIMIT_*_HEADER variables, with the reference's defaults).
    limit_header: str = "RateLimit-Limit"
    remaining_header: str = "RateLimit-Remaining"
    reset_header: str = "RateLimit-Reset"
    json_body: bool = False  # JSON body (raw_body) on OVER_LIMIT answers
    dynamic_metadata: bool = False  # decision details as dynamic metadata for access logs
    # OpenTelemetry tracing (rls/tracing): OTLP export configured by the OTEL_EXPORTER_OTLP_*
    # variables; the resource's service name, namespace and instance id (default: a UUID).
    tracing_enabled: bool = False
    tracing_protocol: str = "http"  # OTLP over http (protobuf) or grpc
    tracing_service_name: str = "RateLimit"
    tracing_service_namespace: str = ""
    tracing_service_instance_id: str = ""
    tracing_sampling_rate: float = 1.0  # of new traces; a caller's sampled flag is followed
    # Start without any descriptor loaded (every call answered OK until a config appears).
    # Off: a missing path, no --config or zero domains is a startup error.
    allow_empty_config: bool = False
    # Read every file of a --config directory, not only *.yaml / *.yml (dot files still
    # skipped): the reference's runtime loader does, and the `ratelimit` entry asks for it.
    config_all_files: bool = False
    strict: bool = False  # config warnings (duplicate YAML key, no requests_per_unit) are errors
    counters_config: str = ""  # frequency counters YAML (per-domain timezone, key_hash, caches)
    # Admin listener off loopback without RLS_ADMIN_TOKEN: refused unless this is set.
    admin_insecure: bool = False
    grpc_token: str = ""  # when set, gRPC calls need metadata `authorization: Bearer <token>`
    # A sampled JSON line per decision for `rls replay` (rls/engine/decision_log.py); "" = off.
    decision_log: str = ""
    decision_log_sample: float = 1.0  # fraction of callers (domain + descriptors) logged
    decision_log_max_bytes: int = 100 * 1024 * 1024  # per file; one rotated backup is kept
    # ext_proc (the response cache, with --cache-config) has a listener of its own, on loopback
    # by default: its calls write entries that are served to every user. Set it to the
    # --grpc-addr value to serve ext_proc on the main gRPC port instead.
    extproc_addr: str = "127.0.0.1:8082"
    # Concurrent streams per HTTP/2 connection on every gRPC listener (a client that opens
    # more waits for one to end; Envoy opens another connection).
    max_concurrent_streams: int = 1024
    # The admin listener serves only its read routes (/healthcheck, /metrics, /rlconfig): safe
    # off loopback without RLS_ADMIN_TOKEN (the `ratelimit` entry's default: probes reach it).
    admin_read_only: bool = False
    # A listener of its own serving only the Prometheus metrics at prometheus_path ("" = off;
    # the reference's USE_PROMETHEUS + PROMETHEUS_ADDR, e.g. Envoy Gateway's ":19001").
    prometheus_addr: str = ""
    prometheus_path: str = "/metrics"
    # Also serve envoyproxy/ratelimit's series (its default statsd mapping's names and labels,
    # rls.observability.reference_metrics): what Envoy Gateway's dashboard reads.
    # `/bin/ratelimit` turns it on with USE_PROMETHEUS=true.
    reference_metrics: bool = False
    # Config over xDS (rls/config/xds, docs/configuration.md): FILE reads --config;
    # GRPC_XDS_SOTW takes every domain from a control plane's ADS stream instead.
    config_type: str = "FILE"
    xds_server_url: str = "localhost:18000"
    xds_node_id: str = "default"
    xds_node_metadata: str = ""  # k1:v1,k2:v2 (k=v too, as the reference)
    xds_additional_headers: str = ""  # k1:v1,k2:v2: gRPC metadata on the stream
    xds_server_use_tls: bool = False
    xds_client_tls_cert: str = ""
    xds_client_tls_key: str = ""
    xds_server_tls_cacert: str = ""  # "" = the system's roots
    xds_server_tls_san: str = ""  # the name the server's certificate must carry
    # Durations in seconds; the flags and variables also take Go forms (`3s`, `1m30s`).
    xds_connect_retry_interval: float = 3.0
    xds_backoff_initial: float = 10.0
    xds_backoff_max: float = 60.0
    xds_backoff_random_factor: float = 0.5
    xds_backoff_jitter: bool = True
    xds_max_msg_bytes: int = 0  # largest response accepted; 0 = 4 MiB (gRPC's default)
    # xDS: open the listeners before the first config (no domain: every call OK).
    force_start_without_initial_config: bool = False
    # Health says not serving until a config with at least one domain is in force.
    healthy_with_at_least_one_config_loaded: bool = False
    # TLS on every gRPC listener (grpc_access/tls.py): certificate and key files, re-read when
    # they change. A client CA makes client certificates required (mTLS); a SAN, that name in them.
    grpc_tls: bool = False
    grpc_tls_cert: str = ""
    grpc_tls_key: str = ""
    grpc_tls_client_ca: str = ""
    grpc_tls_client_san: str = ""

    def validate(self) -> None:
        """Reject every bad value with a SettingError naming the setting (the CLI turns the
        name into the flag or environment variable it came from)."""
        level = self.log_level.lower()
        self.log_level = LOG_LEVEL_ALIASES.get(level, level)
        self.log_format = self.log_format.lower()
        self.tracing_protocol = self.tracing_protocol.lower()
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise SettingError(name, f"{value!r} is not one of {', '.join(allowed)}")
        if len(self.key_prefix.encode()) > 32:
            raise SettingError("key_prefix", "must be at most 32 bytes")
        if self.loop == "uvloop" and not uvloop_installed():
            raise SettingError("loop", "uvloop is not installed (pip install uvloop)")
        for name, low in MINIMUM.items():
            _check_range(name, getattr(self, name), low, MAXIMUM.get(name, INT32_MAX))
        for name in (
            "fallback_share", "near_limit_ratio", "decision_log_sample", "tracing_sampling_rate"
        ):
            if not 0 <= getattr(self, name) <= 1:
                raise SettingError(name, f"{getattr(self, name)!r} is not between 0 and 1")
        for name in ("grpc_addr", "http_addr", "extproc_addr", "prometheus_addr"):
            _check_addr(name, getattr(self, name))
        for name in HEADER_NAMES:
            _check_header_name(name, getattr(self, name))
        if not self.prometheus_path.startswith("/"):
            raise SettingError("prometheus_path", f"{self.prometheus_path!r} must start with /")
        if not (self.admin_insecure or self.admin_read_only or admin_token()):
            if not is_loopback(self.http_addr):
                raise SettingError(
                    "http_addr",
                    f"admin listener {self.http_addr} is not on loopback and RLS_ADMIN_TOKEN "
                    "is not set: set a token, bind --http-addr 127.0.0.1:PORT, "
                    "serve only the read routes (--admin-read-only) or pass --admin-insecure",
                )
        problem = bare_url_problem(self.redis_url)
        if problem is not None:
            raise SettingError("redis_url", f"{redact(self.redis_url)!r}: {problem}")
        try:
            self.redis_url = normalize_redis_url(self.redis_url, env_with_prefix("REDIS_"))
        except ValueError as exc:
            raise SettingError("redis_url", str(exc)) from None
        for name, schemes in URL_SCHEMES.items():
            _check_url(name, getattr(self, name), schemes)
        self._validate_xds()
        self._check_tls()
        for name in ("redis_tls_client_cert", "redis_tls_client_key", "redis_tls_cacert"):
            _check_readable(name, getattr(self, name))

    def _check_tls(self) -> None:
        """TLS needs both files; a SAN can only be checked in a client certificate."""
        if not self.grpc_tls:
            return
        for name in ("grpc_tls_cert", "grpc_tls_key"):
            if not getattr(self, name):
                raise SettingError(name, "is required when gRPC TLS is on")
        if self.grpc_tls_client_san and not self.grpc_tls_client_ca:
            raise SettingError(
                "grpc_tls_client_san", "needs a client CA (client certificates required)"
            )

    def _validate_xds(self) -> None:
        """CONFIG_TYPE=GRPC_XDS_SOTW: a server, well-formed lists, a whole client key pair,
        and no --config beside it (rls/config/xds: no domain comes from two sources)."""
        for name, check in (("xds_node_metadata", lambda t: parse_pairs(t, "=:")),
                            ("xds_additional_headers", stream_headers)):
            try:
                check(getattr(self, name))
            except ValueError as exc:
                raise SettingError(name, str(exc)) from None
        if self.config_type != "GRPC_XDS_SOTW":
            return
        if self.config:
            raise SettingError(
                "config_type", "GRPC_XDS_SOTW takes every domain from the control plane: "
                "--config (RLS_CONFIG) cannot be given beside it",
            )
        if not self.xds_server_url:
            raise SettingError("xds_server_url", "is empty")
        if bool(self.xds_client_tls_cert) != bool(self.xds_client_tls_key):
            raise SettingError(
                "xds_client_tls_cert" if not self.xds_client_tls_cert else "xds_client_tls_key",
                "a client certificate needs both the certificate and its key",
            )


def _check_range(name: str, value: float, low: float, high: float) -> None:
    """`nan` compares false with everything, so it is named before the bounds are."""
    if not math.isfinite(value):
        raise SettingError(name, f"{value!r} is not a finite number")
    if value < low:
        raise SettingError(name, f"{value!r} is below the minimum {low}")
    if value > high:
        raise SettingError(name, f"{value!r} is above the maximum {high}")


# The settings that name a response header, and what such a name may hold: an HTTP field
# name is a token (RFC 9110, section 5.1); anything else Envoy would refuse to add.
HEADER_NAMES = ("limit_header", "remaining_header", "reset_header")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def _check_header_name(name: str, value: str) -> None:
    if not _TOKEN.fullmatch(value):
        raise SettingError(name, f"{value!r} is not an HTTP header name (letters, digits and "
                           "!#$%&'*+-.^_`|~ only, not empty)")


def _check_readable(name: str, path: str) -> None:
    """A file setting names a file this process can read (else rls would fail at its first
    TLS handshake, with an error naming no setting)."""
    if not path:
        return
    if not os.path.isfile(path):
        what = "not a regular file" if os.path.exists(path) else "no such file"
        raise SettingError(name, f"{path}: {what}")
    try:
        with open(path, "rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise SettingError(name, f"{path}: cannot be read ({exc.strerror or exc})") from None


def _check_url(name: str, url: str, schemes: tuple[str, ...]) -> None:
    """A store URL's scheme is one of `schemes` and its host, port and db are well formed
    (`redis://host:6379/abc` would otherwise start on db 0; redis-py ignores a bad db)."""
    if not url:
        return
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in schemes:
        one_of = ", ".join(scheme_ + "://" for scheme_ in schemes)
        raise SettingError(name, f"{redact(url)!r}: the scheme must be one of {one_of}")
    problem = bare_url_problem(url) or url_problem(url)
    if problem is not None:
        raise SettingError(name, f"{redact(url)!r}: {problem}")


def _check_addr(name: str, addr: str) -> None:
    """`host:port` (host may be empty or `[v6]`); gRPC listeners also take `unix:` paths."""
    if name == "prometheus_addr" and not addr:
        return  # off
    if name in GRPC_ADDRS and addr.startswith(("unix:", "unix-abstract:")):
        return
    _, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise SettingError(name, f"{addr!r} is not host:port")


class SettingError(ValueError):
    """A bad setting value; `name` is the Settings field, so the message can name its source."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name
        self.message = message



def is_loopback(addr: str) -> bool:
    """Whether a `host:port` listen address is reachable from this host only."""
    host = addr.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # empty (all interfaces) or a host name: assume reachable
        return False

