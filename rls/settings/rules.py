"""What Settings.validate checks values against: closed sets, lower bounds, URL schemes, and
which settings are durations or may be `unix:` paths.

Tables only (no rls import): rls.settings validates with them, rls.cli_flags shows them in
the flags' help and parses durations by them.
"""

from __future__ import annotations

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

# Closed sets of values, and lower bounds, checked by Settings.validate.
CHOICES: dict[str, tuple[str, ...]] = {
    "failure_mode": ("allow", "deny"),
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
# reference's variables are written (rls.value_forms.parse_duration).
DURATIONS = frozenset(
    {"xds_connect_retry_interval", "xds_backoff_initial", "xds_backoff_max"}
)
