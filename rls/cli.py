"""`rls serve`, `rls check-config`."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import fields
from importlib import metadata

from rls.cli_hints import parse_args
from rls.config.errors import ConfigError, ConfigWarning
from rls.config.loader import discover, load_files, load_paths, read_text, yaml_files_under
from rls.config.reload import check_config_command, problems_line
from rls.config.xds.options import XDS_FLAGS, parse_duration
from rls.config.yaml_source import parse_yaml
from rls.event_loop import loop_factory
from rls.frequency.model import is_counters_doc
from rls.frequency.model import load_config as load_counters_config
from rls.logging_setup import setup_logging
from rls.response_cache import check_cache_file, is_cache_file
from rls.response_cache.cli import add_parser as add_cache_parser
from rls.response_cache.cli import command as cache_command
from rls.settings import (
    CHOICES,
    DURATIONS,
    LOG_LEVEL_ALIASES,
    REFERENCE_ENV,
    REFERENCE_ENV_FALLBACK,
    SettingError,
    Settings,
    admin_token,
    env_source,
    env_value,
    parse_bool,
)
from rls.tls import startup_problem as tls_startup_problem
from rls.top_cli import add_parser as add_top_parser

# Settings exposed as flags: name -> help. Every flag also reads RLS_<NAME>.
FLAGS = {
    "grpc_addr": "gRPC listen address (RateLimitService, health)",
    "http_addr": "admin HTTP listen address",
    "redis_url": "redis://, rediss:// or unix:// URL; none = embedded in-memory backend",
    "cache_config": "response cache rules: serves Envoy ext_proc on --extproc-addr",
    "cache_store": "cache store URL (redis://, rediss://, ssdb://host:port); default: rules file",
    "workers": "worker processes sharing the gRPC port",
    "worker_max_failures": "--workers > 1: consecutive failures of one worker (restarted with "
    "back-off) before the supervisor exits 1",
    "failure_mode": "answer when the backend fails: allow (OK) or deny (OVER_LIMIT)",
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
    "reload_interval": "seconds between config change checks (0 = no reload)",
    "shutdown_delay_ms": "after SIGTERM, keep serving this long with readiness 503",
    "drain_seconds": "then the longest wait for in-flight calls before exiting",
    "max_descriptors": "most descriptors per request",
    "max_entries": "most entries per descriptor",
    "max_value_bytes": "longest entry key or value",
    "max_request_bytes": "largest request message",
    "response_headers": "add RateLimit-Limit/-Remaining/-Reset/-Policy to responses",
    "json_body": "JSON body on 429 answers (raw_body)",
    "dynamic_metadata": "decision details as dynamic metadata for access logs",
    "tracing_enabled": "OpenTelemetry tracing: spans exported by OTLP (OTEL_EXPORTER_OTLP_*)",
    "tracing_protocol": "OTLP transport of the spans",
    "tracing_service_name": "service.name of rls's spans",
    "tracing_service_namespace": "service.namespace of rls's spans",
    "tracing_service_instance_id": "service.instance.id of rls's spans ('': a random UUID)",
    "tracing_sampling_rate": "fraction of new traces recorded (a caller's decision is kept)",
    "allow_empty_config": "start even with no descriptor loaded (every call answered OK)",
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
    **XDS_FLAGS,
    "grpc_tls": "serve TLS on every gRPC listener (on/off); files re-read when they change",
    "grpc_tls_cert": "gRPC TLS certificate (chain) PEM file",
    "grpc_tls_key": "gRPC TLS private key PEM file",
    "grpc_tls_client_ca": "CA PEM file: client certificates required and verified (mTLS)",
    "grpc_tls_client_san": "a SAN every client certificate must carry (needs a client CA)",
}

ADMIN_URL_DEFAULT = "http://127.0.0.1:8080"
_KIND_TEXT = {"bool": "on or off", "int": "an integer", "float": "a number"}


def _kind(name: str) -> str:
    kind = {f.name: f.type for f in fields(Settings)}[name]
    return kind if isinstance(kind, str) else kind.__name__


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _env_names(name: str) -> str:
    names = [f"RLS_{name.upper()}"]
    if name in REFERENCE_ENV:
        names.append(REFERENCE_ENV[name])
    if name in REFERENCE_ENV_FALLBACK:
        names.append(REFERENCE_ENV_FALLBACK[name])
    return " or ".join(names)


def _settings_from(args: argparse.Namespace) -> Settings:
    """Settings from flags, then RLS_* / reference env names, then defaults.

    Raises ValueError with one line naming the flag or variable a bad value came from.
    """
    settings = Settings()
    sources: dict[str, str] = {}
    for name in FLAGS:
        value = getattr(args, name, None)
        source = _flag(name)
        if value is None:
            found = env_source(name)
            if found is None:
                continue
            source, value = found
        sources[name] = source
        kind = _kind(name)
        try:
            if name in DURATIONS:
                value = parse_duration(str(value))
            elif kind == "bool":
                value = value if isinstance(value, bool) else parse_bool(str(value))
            elif kind == "int":
                value = int(value)
            elif kind == "float":
                value = float(value)
        except ValueError:
            what = "a duration (10s, 1m30s)" if name in DURATIONS else _KIND_TEXT[kind]
            raise ValueError(f"{source}: {value!r} is not {what}") from None
        setattr(settings, name, value)
    config = list(getattr(args, "config", None) or [])
    if not config:
        env_config = env_value("config")
        if env_config:
            config = env_config.split(",")
    settings.config = config
    try:
        settings.validate()
    except SettingError as exc:
        raise ValueError(f"{sources.get(exc.name, _flag(exc.name))}: {exc.message}") from None
    return settings


def _version() -> str:
    try:
        return metadata.version("rls")
    except metadata.PackageNotFoundError:
        return "unknown"


def _day(text: str) -> str:
    """`--day` must be a real YYYYMMDD date (the admin API would silently answer 0)."""
    try:
        datetime.datetime.strptime(text, "%Y%m%d")
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date as YYYYMMDD") from None
    return text


def _admin_options(parser: argparse.ArgumentParser) -> None:
    """`--admin` and `--token`, the same for every admin client."""
    parser.add_argument(
        "--admin",
        "--admin-url",
        dest="admin",
        default=env_value("admin_url") or ADMIN_URL_DEFAULT,
        help=f"admin API base URL (default {ADMIN_URL_DEFAULT}; env RLS_ADMIN_URL)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help="bearer token of the admin API (default: env RLS_ADMIN_TOKEN)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rls", description="Envoy rate-limit service")
    parser.add_argument("--version", action="version", version=f"rls {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the service")
    serve.add_argument(
        "--config",
        action="append",
        help="descriptor file or directory (repeatable; env RLS_CONFIG, comma-separated)",
    )
    defaults = Settings()
    for name, text in FLAGS.items():
        default = getattr(defaults, name)
        if _kind(name) == "bool":
            shown = "on" if default else "off"
            serve.add_argument(
                _flag(name), nargs="?", const="true", default=None, metavar="on|off",
                help=f"{text} (default {shown}; env {_env_names(name)})",
            )
        else:
            shown = repr(default) if default == "" else str(default)
            serve.add_argument(
                _flag(name), default=None,
                metavar="|".join(CHOICES[name]) if name in CHOICES else None,
                help=f"{text} (default {shown}; env {_env_names(name)})",
            )
    check = sub.add_parser(
        "check-config", help="validate descriptor, cache rules and counters config files",
        description="Validate config files offline, each kind by its own rules. A file given "
        "as a path is a cache rules file when it has `rules:` (or is a list of `api:` items), a "
        "counters config when it has counters fields (default_timezone, domains, stale_cache, "
        "hot_keys, timeout_ms) and no `domain`/`descriptors`, else a descriptor file; files "
        "inside directories are descriptor or cache rules files, as `rls serve --config` reads "
        "them. --cache-config and --counters-config name a file's kind outright.",
    )
    check.add_argument("paths", nargs="*",
                       help="descriptor, cache rules or counters config files, directories")
    check.add_argument(
        "--config", action="append", default=[], metavar="PATH", dest="config_paths",
        help="same as a path argument (as `rls serve --config`); repeatable",
    )
    check.add_argument(
        "--cache-config", action="append", default=[], metavar="FILE", dest="cache_paths",
        help="a response cache rules file (as `rls serve --cache-config`); repeatable",
    )
    check.add_argument(
        "--counters-config", action="append", default=[], metavar="FILE",
        dest="counters_paths",
        help="a frequency counters config file (as `rls serve --counters-config`); repeatable",
    )
    check.add_argument(
        "--merge-domains", action="store_true",
        help="allow one domain to span several files (default off)",
    )
    check.add_argument(
        "--strict", action="store_true",
        help="warnings (repeated YAML key, rate_limit without requests_per_unit, empty "
        "directory) fail the check (default off)",
    )

    counters = sub.add_parser("counters", help="query counters (no charge) or add hits")
    _admin_options(counters)
    counters.add_argument("--domain", required=True)
    counters.add_argument(
        "-d", "--descriptor", action="append", required=True,
        help="key=value[,key=value…] (repeatable); a comma inside a value: write \\,",
    )
    counters.add_argument("--add", type=int, metavar="HITS", help="charge HITS instead of querying")
    usage = sub.add_parser("usage", help="usage statistics of a domain")
    _admin_options(usage)
    usage.add_argument("--domain", required=True)
    usage.add_argument("--day", type=_day, help="YYYYMMDD (default today)")
    usage.add_argument("--distinct", metavar="KEY", help="count distinct values of KEY")
    usage.add_argument("values", nargs="*", help="key=value of the statistic's keys")
    switches = sub.add_parser("switches", help="show or change runtime switches")
    _admin_options(switches)
    switches.add_argument("--shadow-mode", choices=["on", "off"], help="default: unchanged")
    switches.add_argument("--limiting-off", choices=["on", "off"], help="default: unchanged")
    switches.add_argument(
        "--shadow-domains", help="comma-separated domains ('' for none; default: unchanged)"
    )
    add_cache_parser(sub, _admin_options)
    add_top_parser(sub, env_value("admin_url") or ADMIN_URL_DEFAULT)
    # `rls demo ...` is handed to rls.demo's own parser before this one runs (see main), so
    # `rls demo --help` shows the demo's options; this entry only lists it in `rls --help`.
    sub.add_parser("demo", help="start Envoy + rls + a tiny backend locally (rls demo --help)")
    sub.add_parser("replay", help="decide a traffic log against a config, offline "
                   "(rls replay --help)")
    return parser


def cache_files_in(paths: Sequence[str]) -> list[str]:
    """Cache rule files inside the given directories (discover() leaves them out)."""
    return [
        f for p in paths if os.path.isdir(p) for f in yaml_files_under(p) if is_cache_file(f)
    ]


def empty_directories(paths: Sequence[str]) -> list[ConfigWarning]:
    """Directories among `paths` with no YAML file at all: a wrong mount or path, usually."""
    return [
        ConfigWarning(p, "directory has no descriptor files (*.yaml, *.yml)")
        for p in paths
        if os.path.isdir(p) and not yaml_files_under(p)
    ]


def is_counters_file(path: str) -> bool:
    """A counters config (`--counters-config`), told apart from a descriptor file by its
    top-level fields; unreadable or invalid YAML is not one (the descriptor loader says why)."""
    try:
        return is_counters_doc(parse_yaml(path, read_text(path)))
    except ConfigError:
        return False


def check_counters_file(path: str) -> None:
    """Raise ConfigError when the counters config would not load in `rls serve`."""
    try:
        load_counters_config(path)
    except (ValueError, TypeError, AttributeError) as exc:
        text = str(exc).removeprefix(f"{path}: ")
        raise ConfigError(path, f"counters config: {text}") from None


def check_config(paths: Sequence[str], merge_domains: bool, strict: bool = False,
                 cache_paths: Sequence[str] = (), counters_paths: Sequence[str] = ()) -> int:
    """Validate every file; print `file: message (at file:line, node path)` per error and
    `file: warning: …` per warning; exit 1 on any error (or warning with --strict).

    Cache rules files and counters configs among the named files are recognised (see the
    sub-command's description) or named by `cache_paths` / `counters_paths`."""
    errors = 0
    files: list[tuple[str, str]] = []
    warnings = empty_directories(paths)
    named = {p for p in paths if os.path.isfile(p)}
    try:
        names = discover(paths) + cache_files_in(paths)
    except ConfigError as exc:
        print(exc.detail(), file=sys.stderr)
        return 1
    names += [*cache_paths, *counters_paths]
    counters = 0
    for name in names:
        try:
            if name in counters_paths or (name in named and name not in cache_paths
                                          and is_counters_file(name)):
                check_counters_file(name)
                counters += 1
                continue
            if name in cache_paths or is_cache_file(name):
                check_cache_file(name)
                continue
            text = read_text(name)
            warnings += load_files([(name, text)], merge_domains=True).warnings
            files.append((name, text))
        except ConfigError as exc:
            print(exc.detail(), file=sys.stderr)
            errors += 1
    for warning in warnings:
        print(warning, file=sys.stderr)
    if not errors:
        try:  # cross-file conditions: duplicate domains, duplicate nodes when merging
            config = load_files(files, merge_domains)
        except ConfigError as exc:
            print(exc.detail(), file=sys.stderr)
            return 1
        if strict and warnings:
            print(f"FAILED (--strict): {len(warnings)} warning(s)", file=sys.stderr)
            return 1
        cache_count = len(names) - len(files) - counters
        print(
            f"OK: {len(files)} descriptor file(s), {len(config.domains)} domain(s), "
            f"{cache_count} cache rules file(s)"
            + (f", {counters} counters config file(s)" if counters else "")
            + (f", {len(warnings)} warning(s)" if warnings else "")
        )
    return 1 if errors else 0


def startup_problem(settings: Settings) -> str | None:
    """Why `rls serve` must not start (one line), before anything is set up; None if it can.

    Without --allow-empty-config a service with no limits is a mistake, not a mode: no
    --config, a missing path or (with --strict) an empty directory stops it here.
    """
    if settings.cache_config and not os.path.isfile(settings.cache_config):
        return f"--cache-config: {settings.cache_config}: no such file"
    tls_problem = tls_startup_problem(settings)
    if tls_problem is not None:
        return tls_problem
    if settings.allow_empty_config or settings.config_type == "GRPC_XDS_SOTW":
        return None
    if not settings.config:
        return (
            "no descriptor config: pass --config PATH (env RLS_CONFIG), "
            "or --allow-empty-config to start without limits"
        )
    for path in settings.config:
        if not os.path.exists(path):
            return f"--config: {path}: no such file or directory"
    if settings.strict:
        for warning in empty_directories(settings.config):
            return f"--config: {warning.file}: {warning.message} (--strict)"
    return None


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


def _admin_command(args: argparse.Namespace) -> int:
    from rls.admin import client

    token = args.token or admin_token()
    try:
        if args.command == "counters":
            if args.add is not None:
                return client.add(args.admin, args.domain, args.descriptor, args.add, token)
            return client.counters(args.admin, args.domain, args.descriptor, token)
        if args.command == "usage":
            return client.usage(
                args.admin, args.domain, args.values, args.day, args.distinct, token
            )
        if args.command == "cache":
            return cache_command(args, token)
        changes: dict[str, object] = {}
        if args.shadow_mode:
            changes["shadow_mode"] = args.shadow_mode == "on"
        if args.limiting_off:
            changes["limiting_off"] = args.limiting_off == "on"
        if args.shadow_domains is not None:
            changes["shadow_domains"] = [d for d in args.shadow_domains.split(",") if d]
        return client.switches(args.admin, changes, token)
    except (ValueError, OSError) as exc:
        return client.fail(args.command, str(exc))


def main(argv: Sequence[str] | None = None, notes: Sequence[tuple[int, str]] = ()) -> int:
    """`notes`: (level, line)s `rls serve` logs at start (rls.reference_env's, for one)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:
        # The demo has its own parser: its flags and --help reach it untouched.
        from rls.demo import main as demo_main

        return demo_main(argv[1:], prog="rls demo")
    if argv[:1] == ["replay"]:  # its own parser, loaded only when used
        from rls.replay.cli import main as replay_main

        return replay_main(argv[1:])
    parser = _parser()
    args = parse_args(parser, argv)  # a typo: the sub-command's usage, "did you mean"
    if args.command == "check-config":
        paths = [*args.paths, *args.config_paths]
        if not (paths or args.cache_paths or args.counters_paths):
            parser.error("check-config: give the files or directories to check "
                         "(paths, or --config PATH)")
        return check_config(paths, args.merge_domains, args.strict, args.cache_paths,
                            args.counters_paths)
    if args.command in ("counters", "usage", "switches", "cache"):
        return _admin_command(args)
    if args.command == "top":
        from rls.top_cli import main as top_main

        return top_main(args)
    try:
        settings = _settings_from(args)
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
    for level, note in notes:
        log.log(level, "%s", note)
    for warning in empty_directories(settings.config):
        log.warning("%s", warning)
    if settings.workers > 1:
        # Check the config once here: a worker that cannot load it would exit and be
        # restarted forever by the supervisor.
        try:
            config = load_paths(settings.config, settings.merge_domains)
        except ConfigError as exc:
            command = check_config_command(settings.config, settings.merge_domains,
                                           settings.strict)
            print(f"rls: cannot start: the config does not load: {problems_line(exc)} "
                  f"(every problem: {command})", file=sys.stderr)
            return 1
        xds = settings.config_type == "GRPC_XDS_SOTW"  # each worker gets its own stream
        if not config.domains and not settings.allow_empty_config and not xds:
            print("rls: no domain loaded (0 descriptor files)", file=sys.stderr)
            return 1
        if not settings.redis_url:
            print(
                "rls: --workers > 1 needs --redis-url: the memory backend is per process and "
                "would multiply every limit by the number of workers",
                file=sys.stderr,
            )
            return 2
        from rls.workers import supervise

        budget = settings.shutdown_delay_ms / 1000 + settings.drain_seconds + 5.0
        return supervise(
            _without_workers(argv), settings.workers, budget,
            max_failures=settings.worker_max_failures,
        )
    from rls.server import serve

    try:
        with asyncio.Runner(loop_factory=loop_factory(settings.loop)) as runner:
            return runner.run(serve(settings))
    except KeyboardInterrupt:
        return 0
