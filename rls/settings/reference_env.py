"""The `ratelimit` entry's settings: envoyproxy/ratelimit's environment turned into `rls serve`.

Envoy Gateway (and other deployments of the reference) start the image as `/bin/ratelimit`
with no arguments and describe everything in the reference's variables. `plan()` reads them
and returns the `rls serve` command line they mean, plus the lines rls logs at start:

- listeners: `GRPC_HOST`:`GRPC_PORT` (or `GRPC_UDS`) for gRPC, `HOST`:`PORT` for the admin
  HTTP server (reference default 0.0.0.0:8080, where Envoy Gateway's probes GET
  /healthcheck). Off loopback and without `RLS_ADMIN_TOKEN` that listener serves its read
  routes only (--admin-read-only): nothing there charges or changes state. With a token it is
  the whole admin API, guarded by the token as under `rls serve`.
- config, `CONFIG_TYPE=FILE` (the default): the directory
  `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`, as the reference's runtime loader
  reads it (every file, whatever its name); an empty directory starts (no limits), a missing
  one is a start-up error as there.
  Edits inside it and a swap of a symlink on the way to it (`RUNTIME_WATCH_ROOT=true`'s
  layout: `RUNTIME_ROOT` a link moved to a new version) are both picked up
  (rls.config.reload). Dot files are always skipped (`RUNTIME_IGNOREDOTFILES=false` is noted).
  `CONFIG_TYPE=GRPC_XDS_SOTW`: no directory; the xDS client reads its own variables.
- a store that cannot decide: `--failure-mode error`, a fast gRPC UNAVAILABLE, as the
  reference returns an error, so Envoy's `failure_mode_deny` decides (RLS_FAILURE_MODE wins).
- metrics: `USE_PROMETHEUS=true` serves them on `PROMETHEUS_ADDR` (default :9090) at
  `PROMETHEUS_PATH`, with the reference's own series beside rls's (--reference-metrics: the
  names and labels of its default mapping, which Envoy Gateway's mapping file repeats);
  `USE_STATSD=true` is answered by one line (no statsd sink).

An `RLS_<NAME>` variable still wins over what the reference's variables say (no flag is passed
for it). Variables of the reference that rls reads nowhere are listed in one start-up line;
what is read is derived from REFERENCE_ENV and REFERENCE_ENV_FALLBACK (rls.settings.environment)
plus this module's ENTRY_ENV, so a variable mapped there later leaves the line by itself.
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field

from rls.settings.environment import REFERENCE_ENV, REFERENCE_ENV_FALLBACK, process_env
from rls.settings.forms import parse_bool

# Every variable envoyproxy/ratelimit reads (src/settings/settings.go), plus what Envoy Gateway
# sets beside them: GRPC_SERVER_TLS_CA_CERT (no reference setting has that name) and the
# OpenTelemetry exporter's endpoints.
REFERENCE_VARIABLES = frozenset("""
HOST PORT DEBUG_HOST DEBUG_PORT GRPC_UDS GRPC_HOST GRPC_PORT GRPC_MAX_CONNECTION_AGE
GRPC_MAX_CONNECTION_AGE_GRACE GRPC_SERVER_USE_TLS GRPC_SERVER_TLS_CERT GRPC_SERVER_TLS_KEY
GRPC_CLIENT_TLS_CACERT GRPC_CLIENT_TLS_SAN LOG_LEVEL LOG_FORMAT CONFIG_TYPE
FORCE_START_WITHOUT_INITIAL_CONFIG CONFIG_GRPC_XDS_NODE_ID CONFIG_GRPC_XDS_NODE_METADATA
CONFIG_GRPC_XDS_SERVER_URL CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL
CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS CONFIG_GRPC_XDS_SERVER_USE_TLS
CONFIG_GRPC_XDS_CLIENT_TLS_CERT CONFIG_GRPC_XDS_CLIENT_TLS_KEY CONFIG_GRPC_XDS_SERVER_TLS_CACERT
CONFIG_GRPC_XDS_SERVER_TLS_SAN XDS_CLIENT_BACKOFF_INITIAL_INTERVAL XDS_CLIENT_BACKOFF_MAX_INTERVAL
XDS_CLIENT_BACKOFF_RANDOM_FACTOR XDS_CLIENT_BACKOFF_JITTER XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES
USE_DOG_STATSD USE_DOG_STATSD_MOGRIFIERS USE_STATSD STATSD_HOST STATSD_PORT EXTRA_TAGS
STATS_FLUSH_INTERVAL DISABLE_STATS USE_PROMETHEUS PROMETHEUS_ADDR PROMETHEUS_PATH
PROMETHEUS_MAPPER_YAML PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS RUNTIME_ROOT
RUNTIME_SUBDIRECTORY RUNTIME_APPDIRECTORY RUNTIME_IGNOREDOTFILES RUNTIME_WATCH_ROOT
EXPIRATION_JITTER_MAX_SECONDS LOCAL_CACHE_SIZE_IN_BYTES NEAR_LIMIT_RATIO CACHE_KEY_PREFIX
BACKEND_TYPE STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT LIMIT_RESPONSE_HEADERS_ENABLED
LIMIT_LIMIT_HEADER LIMIT_REMAINING_HEADER LIMIT_RESET_HEADER
HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED REDIS_SOCKET_TYPE REDIS_TYPE REDIS_URL REDIS_POOL_SIZE
REDIS_AUTH REDIS_TLS REDIS_TLS_CLIENT_CERT REDIS_TLS_CLIENT_KEY REDIS_TLS_CACERT
REDIS_TLS_SKIP_HOSTNAME_VERIFICATION REDIS_PIPELINE_WINDOW REDIS_PIPELINE_LIMIT
REDIS_CLUSTER_PIPELINE_PARALLELISM REDIS_PERSECOND REDIS_PERSECOND_SOCKET_TYPE
REDIS_PERSECOND_TYPE REDIS_PERSECOND_URL REDIS_PERSECOND_POOL_SIZE REDIS_PERSECOND_AUTH
REDIS_PERSECOND_TLS REDIS_SENTINEL_AUTH REDIS_PERSECOND_SENTINEL_AUTH
REDIS_PERSECOND_PIPELINE_WINDOW REDIS_PERSECOND_PIPELINE_LIMIT
REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM REDIS_HEALTH_CHECK_ACTIVE_CONNECTION REDIS_TIMEOUT
REDIS_PERSECOND_TIMEOUT REDIS_POOL_ON_EMPTY_BEHAVIOR REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR
REDIS_STARTUP_INITIAL_INTERVAL REDIS_STARTUP_MAX_INTERVAL REDIS_STARTUP_MAX_ELAPSED_TIME
MEMCACHE_HOST_PORT MEMCACHE_MAX_IDLE_CONNS MEMCACHE_SRV MEMCACHE_SRV_REFRESH MEMCACHE_TLS
MEMCACHE_TLS_CLIENT_CERT MEMCACHE_TLS_CLIENT_KEY MEMCACHE_TLS_CACERT
MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION SHADOW_MODE QUOTA_MODE RESPONSE_DYNAMIC_METADATA
MERGE_DOMAIN_CONFIG TRACING_ENABLED TRACING_SERVICE_NAME TRACING_SERVICE_NAMESPACE
TRACING_SERVICE_INSTANCE_ID TRACING_EXPORTER_PROTOCOL TRACING_SAMPLING_RATE
GRPC_SERVER_TLS_CA_CERT OTEL_EXPORTER_OTLP_ENDPOINT OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
""".split())

# What this module reads itself, and what becomes of it.
ENTRY_ENV: dict[str, str] = {
    "GRPC_HOST": "--grpc-addr host (default 0.0.0.0)",
    "GRPC_PORT": "--grpc-addr port (default 8081)",
    "GRPC_UDS": "--grpc-addr unix:<path>, instead of GRPC_HOST/GRPC_PORT",
    "HOST": "--http-addr host (default 0.0.0.0)",
    "PORT": "--http-addr port (default 8080)",
    "CONFIG_TYPE": "FILE: --config <runtime directory>; GRPC_XDS_SOTW: the xDS client",
    "RUNTIME_ROOT": "--config RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY",
    "RUNTIME_SUBDIRECTORY": "see RUNTIME_ROOT",
    "RUNTIME_APPDIRECTORY": "see RUNTIME_ROOT (default config)",
    "RUNTIME_WATCH_ROOT": "both of its layouts reload (edits; a swap of the root's symlink)",
    "RUNTIME_IGNOREDOTFILES": "dot files are always skipped",
    "USE_PROMETHEUS": "true: --prometheus-addr PROMETHEUS_ADDR --reference-metrics",
    "PROMETHEUS_ADDR": "--prometheus-addr (default :9090) when USE_PROMETHEUS=true",
    "USE_STATSD": "true: one line saying where the metrics are (no statsd sink)",
    "BACKEND_TYPE": "redis only (memcache refused)",
}
# Read by rls.stores.redis.urls.normalize_redis_url when REDIS_URL is a bare host:port.
REDIS_URL_ENV = ("REDIS_SOCKET_TYPE", "REDIS_TYPE", "REDIS_AUTH", "REDIS_TLS")
# Variable prefixes read by a library once the variable on the right is honoured (the
# OpenTelemetry SDK reads OTEL_* itself when tracing is in).
FOLLOWS = {"OTEL_": "TRACING_ENABLED"}

RUNTIME_ROOT_DEFAULT = "/srv/runtime_data/current"
CONFIG_TYPES = ("FILE", "GRPC_XDS_SOTW")
DOCS = "docs/envoy-gateway.md"


@dataclass
class Plan:
    """The `rls serve` command line, the (level, line)s to log at start, or why not to start."""

    argv: list[str] = field(default_factory=lambda: ["serve"])
    notes: list[tuple[int, str]] = field(default_factory=list)
    problem: str | None = None


class EnvProblem(ValueError):
    """A reference variable with a value rls cannot act on (the message names it)."""


def honoured() -> frozenset[str]:
    """Reference variables rls reads under the `ratelimit` entry."""
    names = {*REFERENCE_ENV.values(), *REFERENCE_ENV_FALLBACK.values(), *ENTRY_ENV,
             *REDIS_URL_ENV}
    for prefix, leader in FOLLOWS.items():
        if leader in names:
            names |= {n for n in REFERENCE_VARIABLES if n.startswith(prefix)}
    return frozenset(names)


def ignored(environ: Mapping[str, str]) -> list[str]:
    """The reference variables set in `environ` that rls reads nowhere, sorted."""
    known = honoured()
    return sorted(n for n in REFERENCE_VARIABLES if n in environ and n not in known)


def xds_supported() -> bool:
    """Whether the settings read CONFIG_TYPE (the xDS config client is built in)."""
    return "CONFIG_TYPE" in REFERENCE_ENV.values()


def _flag(env: Mapping[str, str], out: Plan, name: str, value: str | None = None) -> None:
    """Pass `--name [value]` unless RLS_<NAME> is set (the rls variable wins)."""
    if f"RLS_{name.upper()}" in env:
        return
    out.argv.append("--" + name.replace("_", "-"))
    if value is not None:
        out.argv.append(value)


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    text = env.get(name)
    if text is None:
        return default
    try:
        return parse_bool(text)
    except ValueError:
        raise EnvProblem(f"{name}: {text!r} is not true or false") from None


def _addr(env: Mapping[str, str], host_var: str, port_var: str, port: str) -> str:
    host = env.get(host_var) or "0.0.0.0"
    port = env.get(port_var) or port
    if not port.isdigit() or int(port) > 65535:
        raise EnvProblem(f"{port_var}: {port!r} is not a port number")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def config_directory(env: Mapping[str, str]) -> str:
    """RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY with the reference's defaults."""
    return posixpath.join(
        env.get("RUNTIME_ROOT") or RUNTIME_ROOT_DEFAULT,
        env.get("RUNTIME_SUBDIRECTORY", ""),
        env.get("RUNTIME_APPDIRECTORY") or "config",
    )


def _listeners(env: Mapping[str, str], out: Plan) -> None:
    uds = env.get("GRPC_UDS")
    grpc_addr = f"unix:{uds}" if uds else _addr(env, "GRPC_HOST", "GRPC_PORT", "8081")
    _flag(env, out, "grpc_addr", grpc_addr)
    _flag(env, out, "http_addr", _addr(env, "HOST", "PORT", "8080"))
    if not env.get("RLS_ADMIN_TOKEN"):
        _flag(env, out, "admin_read_only")


def _config(env: Mapping[str, str], out: Plan) -> None:
    kind = env.get("CONFIG_TYPE") or "FILE"
    if kind not in CONFIG_TYPES:
        raise EnvProblem(f"CONFIG_TYPE: {kind!r} is not one of {', '.join(CONFIG_TYPES)}")
    if kind == "FILE" and "RLS_CONFIG" not in env:
        directory = config_directory(env)
        if not os.path.isdir(directory):
            raise EnvProblem(
                f"CONFIG_TYPE=FILE: the config directory {directory} "
                "(RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY) does not exist"
            )
        out.argv += ["--config", directory]
        _flag(env, out, "allow_empty_config")  # as the reference: an empty directory starts
    if kind == "FILE":
        _flag(env, out, "config_all_files")  # as the reference: every file, whatever its name
    if kind == "FILE" and env.get("RUNTIME_IGNOREDOTFILES", "").lower() == "false":
        out.notes.append((logging.WARNING, "RUNTIME_IGNOREDOTFILES=false: rls skips dot files "
                          "all the same (a ConfigMap's ..data would be read twice)"))
    if kind == "GRPC_XDS_SOTW" and not xds_supported():
        _flag(env, out, "allow_empty_config")
        out.notes.append((logging.ERROR, "CONFIG_TYPE=GRPC_XDS_SOTW: this rls has no xDS "
                          "config client; serving with no limits (every call OK)"))
    backend = env.get("BACKEND_TYPE") or "redis"
    if backend.lower() != "redis":
        raise EnvProblem(f"BACKEND_TYPE: {backend!r}: rls keeps counters in Redis (REDIS_URL) "
                         "or, without REDIS_URL, in its own memory; there is no memcache store")


def _metrics(env: Mapping[str, str], out: Plan) -> None:
    where = f"http://{_addr(env, 'HOST', 'PORT', '8080')}/metrics"
    if _bool(env, "USE_PROMETHEUS", False):
        addr = env.get("PROMETHEUS_ADDR") or ":9090"
        _flag(env, out, "prometheus_addr", addr)
        _flag(env, out, "reference_metrics")  # what dashboards built on the reference read
        shown = f"0.0.0.0{addr}" if addr.startswith(":") else addr  # Go's ":9090": every address
        where += f" and http://{shown}{env.get('PROMETHEUS_PATH') or '/metrics'}"
    if _bool(env, "USE_STATSD", False):
        out.notes.append((logging.WARNING, f"USE_STATSD=true: rls sends no statsd; its "
                          f"metrics are Prometheus text at {where} (names: {DOCS})"))


def plan(environ: Mapping[str, str] | None = None) -> Plan:
    """What `/bin/ratelimit` runs for this environment (the process environment by default)."""
    env = process_env() if environ is None else environ
    out = Plan()
    try:
        _listeners(env, out)
        _config(env, out)
        _metrics(env, out)
        # The reference answers a gRPC error when Redis fails, so that Envoy's own failure mode
        # decides (failure_mode_deny; Envoy Gateway's failClosed): rls does the same here.
        _flag(env, out, "failure_mode", "error")
    except EnvProblem as exc:
        out.problem = str(exc)
        return out
    unread = ignored(env)
    if unread:
        out.notes.append((logging.WARNING, f"reference variables set but ignored by rls: "
                          f"{', '.join(unread)} (see {DOCS})"))
    return out
