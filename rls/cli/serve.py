"""`rls serve`: its flags, and from them to a running service.

One flag per Settings field in FLAGS (name -> help), each also read from its environment
variables: parsed flags, then `RLS_<NAME>` / the reference's variable
(rls.settings.environment.env_source), then the default, into a validated Settings; a bad value
is one line naming the flag or variable it came from. Then the start-up checks
(`startup_problem`: nothing is set up while one fails), logging, and one process
(rls.process.server) or, with `--workers N`, the supervisor of N (rls.process.workers).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from dataclasses import fields

from rls.cli.check_config import empty_directories
from rls.cli.command import Call, SubParsers
from rls.cli.reference_help import serve_note
from rls.config.errors import ConfigError
from rls.config.loader import load_paths, missing_reason
from rls.config.reload import check_config_command, problems_line
from rls.config.xds.options import XDS_FLAGS
from rls.event_loop import loop_factory
from rls.grpc_access.tls import startup_problem as tls_startup_problem
from rls.observability.logs import setup_logging
from rls.process.workers import supervise
from rls.settings import SettingError, Settings
from rls.settings.environment import (
    REFERENCE_ENV,
    REFERENCE_ENV_FALLBACK,
    env_source,
    env_value,
    process_env,
    worker_index,
)
from rls.settings.forms import parse_bool, parse_duration
from rls.settings.model import CHOICES, DURATIONS, LOG_LEVEL_ALIASES
from rls.tracing import startup_problem as tracing_startup_problem

NAME = "serve"

# Settings exposed as flags: name -> help. Every flag also reads RLS_<NAME>.
FLAGS = {
    "grpc_addr": "gRPC listen address (RateLimitService, health)",
    "http_addr": "admin HTTP listen address",
    "redis_url": "redis://, rediss:// or unix:// URL; none = embedded in-memory backend",
    "redis_tls_client_cert": "rediss://: client certificate file (PEM) for Redis",
    "redis_tls_client_key": "rediss://: the client certificate's key file (PEM)",
    "redis_tls_cacert": "rediss://: CA file (PEM) that signed the Redis server's certificate",
    "redis_tls_skip_hostname_verification": "rediss://: do not check the server's host name",
    "cache_config": "response cache rules: serves Envoy ext_proc on --extproc-addr",
    "cache_store": "cache store URL (redis://, rediss://, ssdb://host:port); default: rules file",
    "workers": "worker processes sharing the gRPC port",
    "worker_max_failures": "--workers > 1: consecutive failures of one worker (restarted with "
    "back-off) before the supervisor exits 1",
    "failure_mode": "answer when the store cannot decide: allow (OK), deny (OVER_LIMIT) or "
    "error (gRPC UNAVAILABLE: Envoy's failure_mode_deny decides)",
    "backend_timeout_ms": "store-time budget of one decision when the caller sends no deadline",
    "deadline_margin_ms": "kept from the caller's gRPC deadline to send the answer",
    "overload_cap_ms": "a decision still waiting after this long: UNAVAILABLE (rls overloaded)",
    "max_inflight": "concurrent decisions per process; beyond: RESOURCE_EXHAUSTED",
    "memory_max_bytes": "memory store: estimated bytes of counters kept; beyond, the least "
    "recently used are evicted",
    "fallback_share": "share of each limit granted locally while the backend is away (0 = off)",
    "breaker_threshold": "consecutive store connection errors that open the circuit breaker",
    "probe_interval_ms": "open circuit: PING the store this often; the first success closes it",
    "probe_timeout_ms": "a probe PING slower than this counts as failed",
    "log_format": "text or json",
    "loop": "event loop: auto (uvloop where installed, else asyncio), uvloop or asyncio",
    "log_level": ", ".join(CHOICES["log_level"])
    + " (also the reference's " + ", ".join(LOG_LEVEL_ALIASES) + ")",
    "shadow_mode": "global shadow mode: report OVER_LIMIT as OK",
    "quota_mode": "treat every descriptor as a quota",
    "limiting_off": "degradation switch: always answer OK",
    "merge_domains": "allow one domain to span several files",
    "near_limit_ratio": "fraction of a limit counted as near_limit",
    "key_prefix": "prefix of every counter key",
    "local_cache": "answer keys known over limit without Redis until their reset (on/off)",
    "auto_pipeline": "decisions through one lean pipelined Redis connection per worker (on/off)",
    "redis_leases": "decide hot fixed-window counters from tokens leased from Redis, exact "
    "across processes (on/off)",
    "reload_interval": "seconds between config change checks (0 = no reload)",
    "shutdown_delay_ms": "after SIGTERM, keep serving this long with readiness 503",
    "drain_seconds": "then the longest wait for in-flight calls before exiting",
    "max_descriptors": "most descriptors per request",
    "max_entries": "most entries per descriptor",
    "max_value_bytes": "longest entry key; a longer value is decided by a stand-in",
    "max_request_bytes": "largest request message",
    "response_headers": "add RateLimit-Limit/-Remaining/-Reset/-Policy to responses",
    "limit_header": "--response-headers: name of the header holding the limit",
    "remaining_header": "--response-headers: name of the header holding what remains",
    "reset_header": "--response-headers: name of the header holding the seconds to reset",
    "json_body": "JSON body on 429 answers (raw_body)",
    "dynamic_metadata": "decision details as dynamic metadata for access logs",
    "tracing_enabled": "OpenTelemetry tracing: spans exported by OTLP (OTEL_EXPORTER_OTLP_*)",
    "tracing_protocol": "OTLP transport of the spans",
    "tracing_service_name": "service.name of rls's spans",
    "tracing_service_namespace": "service.namespace of rls's spans",
    "tracing_service_instance_id": "service.instance.id of rls's spans ('': a random UUID)",
    "tracing_sampling_rate": "fraction of new traces recorded (a caller's decision is kept)",
    "allow_empty_config": "start even with no descriptor loaded (every call answered OK)",
    "config_all_files": "read every file of a --config directory, not only *.yaml / *.yml "
    "(as envoyproxy/ratelimit; dot files still skipped)",
    "strict": "config warnings (repeated YAML key, rate_limit without requests_per_unit, "
    "empty directory) are errors",
    "counters_config": "frequency counters YAML: per-domain timezone and key_hash, caches",
    "admin_insecure": "allow the admin listener off loopback without RLS_ADMIN_TOKEN",
    "grpc_token": "token gRPC callers must send as `authorization: Bearer …` (prefer the env)",
    "decision_log": "write a JSON line per decision to this file, for `rls replay` (off: '')",
    "decision_log_sample": "fraction of callers (domain + descriptors) in the decision log",
    "decision_log_max_bytes": "decision log file size before it rotates (one backup kept)",
    "extproc_addr": "ext_proc (response cache) listen address; --grpc-addr's value: same port",
    "max_concurrent_streams": "concurrent gRPC streams per client connection",
    "admin_read_only": "admin: only /healthcheck, /metrics, /rlconfig (may leave loopback)",
    "prometheus_addr": "also serve the Prometheus metrics on this host:port ('' = off)",
    "prometheus_path": "path of the metrics on --prometheus-addr",
    "reference_metrics": "also serve envoyproxy/ratelimit's Prometheus series (its default "
    "mapping's names and labels, as Envoy Gateway's dashboard reads them)",
    **XDS_FLAGS,
    "grpc_tls": "serve TLS on every gRPC listener (on/off); files re-read when they change",
    "grpc_tls_cert": "gRPC TLS certificate (chain) PEM file",
    "grpc_tls_key": "gRPC TLS private key PEM file",
    "grpc_tls_client_ca": "CA PEM file: client certificates required and verified (mTLS)",
    "grpc_tls_client_san": "a SAN every client certificate must carry (needs a client CA)",
}

_KIND_TEXT = {"bool": "on or off", "int": "an integer", "float": "a number"}


def kind(name: str) -> str:
    """The Settings field's type name: bool, int, float or str."""
    found = {f.name: f.type for f in fields(Settings)}[name]
    return found if isinstance(found, str) else found.__name__


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def env_names(name: str) -> str:
    """The variables a setting is read from, in precedence order, as the help shows them."""
    names = [f"RLS_{name.upper()}"]
    if name in REFERENCE_ENV:
        names.append(REFERENCE_ENV[name])
    if name in REFERENCE_ENV_FALLBACK:
        names.append(REFERENCE_ENV_FALLBACK[name])
    return " or ".join(names)


def add_parser(sub: SubParsers) -> argparse.ArgumentParser:
    """`--config` and one flag per FLAGS entry; a flag not given is None (then env, default)."""
    serve = sub.add_parser(NAME, help="run the service")
    serve.add_argument(
        "--config",
        action="append",
        help="descriptor file or directory (repeatable; env RLS_CONFIG, comma-separated)",
    )
    defaults = Settings()
    for name, text in FLAGS.items():
        default = getattr(defaults, name)
        if kind(name) == "bool":
            shown = "on" if default else "off"
            serve.add_argument(
                flag(name), nargs="?", const="true", default=None, metavar="on|off",
                help=f"{text} (default {shown}; env {env_names(name)})",
            )
        else:
            shown = repr(default) if default == "" else str(default)
            serve.add_argument(
                flag(name), default=None,
                metavar="|".join(CHOICES[name]) if name in CHOICES else None,
                help=f"{text} (default {shown}; env {env_names(name)})",
            )
    return serve


def _typed(name: str, value: object, source: str) -> object:
    """`value` as the Settings field's type; ValueError naming `source` otherwise."""
    what = kind(name)
    try:
        if name in DURATIONS:
            return parse_duration(str(value))
        if what == "bool":
            return value if isinstance(value, bool) else parse_bool(str(value))
        if what == "int":
            return int(str(value))
        if what == "float":
            return float(str(value))
    except ValueError:
        expected = "a duration (10s, 1m30s)" if name in DURATIONS else _KIND_TEXT[what]
        raise ValueError(f"{source}: {value!r} is not {expected}") from None
    return value


def _config_paths(args: argparse.Namespace) -> list[str]:
    """--config (repeated), else RLS_CONFIG split at commas."""
    config = list(getattr(args, "config", None) or [])
    if not config:
        env_config = env_value("config")
        if env_config:
            config = env_config.split(",")
    return config


def settings_from(args: argparse.Namespace) -> Settings:
    """Settings from flags, then RLS_* / reference env names, then defaults.

    Raises ValueError with one line naming the flag or variable a bad value came from.
    """
    settings = Settings()
    sources: dict[str, str] = {}
    for name in FLAGS:
        value = getattr(args, name, None)
        source = flag(name)
        if value is None:
            found = env_source(name)
            if found is None:
                continue
            source, value = found
        sources[name] = source
        setattr(settings, name, _typed(name, value, source))
    settings.config = _config_paths(args)
    try:
        settings.validate()
    except SettingError as exc:
        raise ValueError(f"{sources.get(exc.name, flag(exc.name))}: {exc.message}") from None
    return settings


def startup_problem(settings: Settings) -> str | None:
    """Why `rls serve` must not start (one line), before anything is set up; None if it can.

    Without --allow-empty-config a service with no limits is a mistake, not a mode: no
    --config, a missing path or (with --strict) an empty directory stops it here.
    """
    if settings.cache_config and not os.path.isfile(settings.cache_config):
        what = "not a regular file" if os.path.exists(settings.cache_config) else "no such file"
        return f"--cache-config: {settings.cache_config}: {what}"
    tls_problem = tls_startup_problem(settings)
    if tls_problem is not None:
        return tls_problem
    tracing_problem = tracing_startup_problem(settings)
    if tracing_problem is not None:
        return tracing_problem
    if settings.allow_empty_config or settings.config_type == "GRPC_XDS_SOTW":
        return None
    if not settings.config:
        return (
            "no descriptor config: pass --config PATH (env RLS_CONFIG), "
            "or --allow-empty-config to start without limits"
        )
    for path in settings.config:
        if not os.path.exists(path):
            return f"--config: {path}: {missing_reason(path)}"
    if settings.strict:
        for warning in empty_directories(settings.config, settings.config_all_files):
            return f"--config: {warning.file}: {warning.message} (--strict)"
    return None


def run(args: argparse.Namespace, call: Call) -> int:
    """Settings, the start-up checks, logging, then one process or the workers."""
    try:
        settings = settings_from(args)
    except ValueError as exc:
        print(f"rls: {exc}", file=sys.stderr)
        return 2
    problem = startup_problem(settings)
    if problem is not None:
        print(f"rls: {problem}", file=sys.stderr)
        return 2
    setup_logging(
        settings.log_level, settings.log_format, "supervisor" if settings.workers > 1 else None
    )
    log = logging.getLogger("rls")
    notes = _reference_notes() if call.notes is None else call.notes
    for level, note in notes:
        log.log(level, "%s", note)
    for warning in empty_directories(settings.config, settings.config_all_files):
        log.warning("%s", warning)
    if settings.workers > 1:
        return _supervise(settings, list(call.argv))
    # Lazy: the server's imports (aiohttp, every service, the response cache) take seconds on
    # a loaded host, and only a serving process needs them: not the other sub-commands, not
    # the --workers supervisor.
    from rls.process.server import serve

    try:
        with asyncio.Runner(loop_factory=loop_factory(settings.loop)) as runner:
            return runner.run(serve(settings))
    except KeyboardInterrupt:
        return 0


def _reference_notes() -> list[tuple[int, str]]:
    """`rls serve`'s line naming the reference variables set and not read; a `--workers`
    worker leaves it to its supervisor, which logged it once."""
    if worker_index() is not None:
        return []
    note = serve_note(process_env())
    return [] if note is None else [note]


def _without_workers(argv: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--workers":
            skip = True
            continue
        if arg.startswith("--workers="):
            continue
        out.append(arg)
    return out


def _workers_problem(settings: Settings) -> tuple[int, str] | None:
    """(exit code, line) when `--workers` must not start: checked once here, as a worker that
    cannot load the config would exit and be restarted forever by the supervisor."""
    try:
        config = load_paths(settings.config, settings.merge_domains,
                            every_file=settings.config_all_files)
    except ConfigError as exc:
        command = check_config_command(settings.config, settings.merge_domains, settings.strict,
                                       settings.config_all_files)
        return 1, (f"cannot start: the config does not load: {problems_line(exc)} "
                   f"(every problem: {command})")
    xds = settings.config_type == "GRPC_XDS_SOTW"  # each worker gets its own stream
    if not config.domains and not settings.allow_empty_config and not xds:
        return 1, "no domain loaded (0 descriptor files)"
    if not settings.redis_url:
        return 2, ("--workers > 1 needs --redis-url: the memory backend is per process and "
                   "would multiply every limit by the number of workers")
    return None


def _supervise(settings: Settings, argv: list[str]) -> int:
    """`--workers N`: the supervisor, restarting `rls serve --workers 1` processes."""
    problem = _workers_problem(settings)
    if problem is not None:
        code, line = problem
        print(f"rls: {line}", file=sys.stderr)
        return code
    budget = settings.shutdown_delay_ms / 1000 + settings.drain_seconds + 5.0
    return supervise(
        _without_workers(argv), settings.workers, budget,
        max_failures=settings.worker_max_failures,
    )
