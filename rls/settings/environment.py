"""The process environment: every read of it in rls is here, so what a deployment can set
is found in one place.

A Settings field is read from `RLS_<NAME>`, then from envoyproxy/ratelimit's name for it
(REFERENCE_ENV, then REFERENCE_ENV_FALLBACK); the functions after them read the variables that
are not fields (RLS_ADMIN_TOKEN, RLS_QUOTA_*, the `--workers` protocol, what libraries read). A
module that needs a variable calls one of them. Writing a child process's environment (the
supervisor's workers, the demo's children) stays where the child is started.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

# envoyproxy/ratelimit environment names honoured when the RLS_* one is unset.
REFERENCE_ENV = {
    "redis_url": "REDIS_URL",
    "tracing_enabled": "TRACING_ENABLED",
    "tracing_protocol": "TRACING_EXPORTER_PROTOCOL",
    "tracing_service_name": "TRACING_SERVICE_NAME",
    "tracing_service_namespace": "TRACING_SERVICE_NAMESPACE",
    "tracing_service_instance_id": "TRACING_SERVICE_INSTANCE_ID",
    "tracing_sampling_rate": "TRACING_SAMPLING_RATE",
    "shadow_mode": "SHADOW_MODE",
    "quota_mode": "QUOTA_MODE",
    "merge_domains": "MERGE_DOMAIN_CONFIG",
    "near_limit_ratio": "NEAR_LIMIT_RATIO",
    "key_prefix": "CACHE_KEY_PREFIX",
    "log_level": "LOG_LEVEL",
    "log_format": "LOG_FORMAT",
    "response_headers": "LIMIT_RESPONSE_HEADERS_ENABLED",
    "limit_header": "LIMIT_LIMIT_HEADER",
    "remaining_header": "LIMIT_REMAINING_HEADER",
    "reset_header": "LIMIT_RESET_HEADER",
    "dynamic_metadata": "RESPONSE_DYNAMIC_METADATA",
    "prometheus_path": "PROMETHEUS_PATH",
    # Config over xDS (rls/config/xds; docs/configuration.md, "Config from a control plane")
    "config_type": "CONFIG_TYPE",
    "xds_server_url": "CONFIG_GRPC_XDS_SERVER_URL",
    "xds_node_id": "CONFIG_GRPC_XDS_NODE_ID",
    "xds_node_metadata": "CONFIG_GRPC_XDS_NODE_METADATA",
    "xds_additional_headers": "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
    "xds_server_use_tls": "CONFIG_GRPC_XDS_SERVER_USE_TLS",
    "xds_client_tls_cert": "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
    "xds_client_tls_key": "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
    "xds_server_tls_cacert": "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
    "xds_server_tls_san": "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
    "xds_connect_retry_interval": "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
    "xds_backoff_initial": "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
    "xds_backoff_max": "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
    "xds_backoff_random_factor": "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
    "xds_backoff_jitter": "XDS_CLIENT_BACKOFF_JITTER",
    "xds_max_msg_bytes": "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
    "force_start_without_initial_config": "FORCE_START_WITHOUT_INITIAL_CONFIG",
    "healthy_with_at_least_one_config_loaded": "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
    "grpc_tls": "GRPC_SERVER_USE_TLS",
    "grpc_tls_cert": "GRPC_SERVER_TLS_CERT",
    "grpc_tls_key": "GRPC_SERVER_TLS_KEY",
    "grpc_tls_client_ca": "GRPC_CLIENT_TLS_CACERT",
    "grpc_tls_client_san": "GRPC_CLIENT_TLS_SAN",
    "redis_tls_client_cert": "REDIS_TLS_CLIENT_CERT",
    "redis_tls_client_key": "REDIS_TLS_CLIENT_KEY",
    "redis_tls_cacert": "REDIS_TLS_CACERT",
    "redis_tls_skip_hostname_verification": "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
}
# Read after the REFERENCE_ENV name. Envoy Gateway mounts its CA as GRPC_SERVER_TLS_CA_CERT, a
# name the reference never reads: rls honours it as the client CA (mTLS; docs/admin.md).
REFERENCE_ENV_FALLBACK = {"grpc_tls_client_ca": "GRPC_SERVER_TLS_CA_CERT"}


def env_source(name: str, environ: dict[str, str] | None = None) -> tuple[str, str] | None:
    """(variable, value) of the environment variable a setting is read from, if any is set."""
    env = os.environ if environ is None else environ
    for var in (f"RLS_{name.upper()}", REFERENCE_ENV.get(name), REFERENCE_ENV_FALLBACK.get(name)):
        if var is not None and var in env:
            return var, env[var]
    return None



def env_value(name: str, environ: dict[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    value = env.get(f"RLS_{name.upper()}")
    if value is None and name in REFERENCE_ENV:
        value = env.get(REFERENCE_ENV[name])
    if value is None and name in REFERENCE_ENV_FALLBACK:
        value = env.get(REFERENCE_ENV_FALLBACK[name])
    return value



ADMIN_TOKEN_ENV = "RLS_ADMIN_TOKEN"
QUOTA_ENV_PREFIX = "RLS_QUOTA_"
# The supervisor -> worker protocol of `--workers` (written by rls.process.workers.supervise).
WORKER_ENV = "RLS_WORKER_INDEX"  # the worker's slot, in its log lines
SHARED_DIR_ENV = "RLS_SHARED_DIR"  # the supervisor's directory: status, readiness, metrics
SUPERVISOR_FD_ENV = "RLS_SUPERVISOR_FD"  # read end of the pipe that tells a worker its parent died
DRAIN_BUDGET_ENV = "RLS_DRAIN_BUDGET"  # seconds a worker may take to drain once orphaned
# prometheus_client's multiprocess mode (set for the workers by the supervisor).
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


def process_env() -> Mapping[str, str]:
    """The whole environment, for a module that translates all of it (the `ratelimit` entry's
    reference_env, a child process's environment)."""
    return os.environ


def env_text(name: str) -> str:
    """One variable read by a library rather than by a Settings field (OTEL_BSP_*, which rls
    checks before the OpenTelemetry SDK reads them), stripped; "" when unset."""
    return os.environ.get(name, "").strip()


def quiet_grpc_core() -> None:
    """GRPC_VERBOSITY=ERROR for this process (and its workers) unless the user set it; called
    before grpc is imported, as grpc-core reads it once. At grpc's default, every failed TLS
    handshake writes an INFO line to stderr: an unreachable control plane, retried every 3 s,
    is 20 lines a minute beside rls's own line, which says once a minute what to fix."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


def env_with_prefix(prefix: str) -> dict[str, str]:
    """Every variable whose name starts with `prefix` (OTEL_EXPORTER_OTLP_*, REDIS_*: read
    whole by what translates them)."""
    return {k: v for k, v in os.environ.items() if k.startswith(prefix)}


def admin_token() -> str | None:
    """RLS_ADMIN_TOKEN: the admin API's bearer token, checked by the listener and sent by the
    admin clients (rls counters, rls top ...); unset or empty is None (no token)."""
    return os.environ.get(ADMIN_TOKEN_ENV) or None


def quota_unmatched() -> str:
    """RLS_QUOTA_UNMATCHED: the answer to an RLQS bucket no rule matches (allow | deny; the
    quota service rejects anything else, naming the variable)."""
    return os.environ.get(QUOTA_ENV_PREFIX + "UNMATCHED", "allow")


def quota_bound_texts(
    names: Iterable[str], environ: Mapping[str, str] | None = None
) -> dict[str, tuple[str, str]]:
    """name -> (variable, text) of each quota-mode bound set as RLS_QUOTA_<NAME>; the bounds'
    own module (rls.quota.bounds) parses and checks them."""
    env = os.environ if environ is None else environ
    found: dict[str, tuple[str, str]] = {}
    for name in names:
        var = QUOTA_ENV_PREFIX + name.upper()
        if var in env:
            found[name] = (var, env[var])
    return found


def worker_index() -> str | None:
    """This process's slot under `--workers` (None outside a worker)."""
    return os.environ.get(WORKER_ENV)


def shared_dir() -> str | None:
    """The supervisor's shared directory; set only in a `--workers` worker."""
    return os.environ.get(SHARED_DIR_ENV)


def supervisor_fd() -> int | None:
    """The pipe a worker watches for its supervisor's death (None outside a worker)."""
    raw = os.environ.get(SUPERVISOR_FD_ENV)
    return int(raw) if raw else None


def worker_drain_budget(default: float) -> float:
    """Seconds an orphaned worker may drain before it exits by force."""
    return float(os.environ.get(DRAIN_BUDGET_ENV, default))


def metrics_multiprocess() -> bool:
    """Whether prometheus_client's multiprocess mode is on (metrics summed over workers)."""
    return bool(os.environ.get(MULTIPROC_DIR_ENV))
