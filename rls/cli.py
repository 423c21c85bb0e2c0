"""`rls serve`, `rls check-config`."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from dataclasses import fields

from rls.cache import check_cache_file, is_cache_file
from rls.config.errors import ConfigError
from rls.config.loader import discover, load_files, read_text, yaml_files_under
from rls.logging_setup import setup_logging
from rls.settings import Settings, env_value, parse_bool

# Settings exposed as flags: name -> help. Every flag also reads RLS_<NAME>.
FLAGS = {
    "grpc_addr": "gRPC listen address (RateLimitService, health)",
    "http_addr": "admin HTTP listen address",
    "redis_url": "redis://, rediss:// or unix:// URL; none = embedded in-memory backend",
    "cache_config": "response cache rules: serves Envoy ext_proc on the gRPC port",
    "cache_store": "cache store URL (redis://, rediss://, ssdb://host:port); default: rules file",
    "workers": "worker processes sharing the gRPC port",
    "failure_mode": "answer when the backend fails: allow (OK) or deny (OVER_LIMIT)",
    "backend_timeout_ms": "deadline for one backend call",
    "fallback_share": "share of each limit granted locally while the backend is away (0 = off)",
    "breaker_threshold": "consecutive backend failures that open the circuit breaker",
    "breaker_cooldown_ms": "time an open circuit waits before probing the backend",
    "log_format": "text or json",
    "log_level": "debug, info, warning, error",
    "shadow_mode": "global shadow mode: report OVER_LIMIT as OK",
    "quota_mode": "treat every descriptor as a quota",
    "limiting_off": "degradation switch: always answer OK",
    "merge_domains": "allow one domain to span several files",
    "near_limit_ratio": "fraction of a limit counted as near_limit",
    "key_prefix": "prefix of every counter key",
    "local_cache": "answer keys known over limit without Redis until their reset (on/off)",
    "auto_pipeline": "concurrent Redis calls of a worker share one round trip (on/off)",
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
    "admin_insecure": "allow the admin listener off loopback without RLS_ADMIN_TOKEN",
    "grpc_token": "token gRPC callers must send as `authorization: Bearer …` (prefer the env)",
}


def _settings_from(args: argparse.Namespace) -> Settings:
    settings = Settings()
    types = {f.name: f.type for f in fields(Settings)}
    for name in FLAGS:
        value = getattr(args, name, None)
        if value is None:
            value = env_value(name)
        if value is None:
            continue
        kind = types[name]
        kind = kind if isinstance(kind, str) else kind.__name__
        if kind == "bool":
            value = value if isinstance(value, bool) else parse_bool(str(value))
        elif kind == "int":
            value = int(value)
        elif kind == "float":
            value = float(value)
        setattr(settings, name, value)
    config = list(args.config or [])
    if not config:
        env_config = env_value("config")
        if env_config:
            config = env_config.split(",")
    settings.config = config
    settings.validate()
    return settings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rls", description="Envoy rate-limit service")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the service")
    serve.add_argument(
        "--config", action="append", help="descriptor file or directory (repeatable)"
    )
    types = {f.name: f.type for f in fields(Settings)}
    for name, text in FLAGS.items():
        flag = "--" + name.replace("_", "-")
        kind = types[name] if isinstance(types[name], str) else types[name].__name__
        if kind == "bool":
            serve.add_argument(
                flag, nargs="?", const="true", default=None, metavar="on|off", help=text
            )
        else:
            serve.add_argument(flag, default=None, help=f"{text} (env RLS_{name.upper()})")
    check = sub.add_parser("check-config", help="validate descriptor files and directories")
    check.add_argument("paths", nargs="+")
    check.add_argument("--merge-domains", action="store_true")

    admin_default = env_value("admin_url") or "http://127.0.0.1:8080"
    counters = sub.add_parser("counters", help="query counters (no charge) or add hits")
    counters.add_argument("--admin", default=admin_default, help="admin API base URL")
    counters.add_argument("--domain", required=True)
    counters.add_argument(
        "-d", "--descriptor", action="append", required=True, help="key=value[,key=value…]"
    )
    counters.add_argument("--add", type=int, metavar="HITS", help="charge HITS instead of querying")
    usage = sub.add_parser("usage", help="usage statistics of a domain")
    usage.add_argument("--admin", default=admin_default)
    usage.add_argument("--domain", required=True)
    usage.add_argument("--day", help="YYYYMMDD (default today)")
    usage.add_argument("--distinct", metavar="KEY", help="count distinct values of KEY")
    usage.add_argument("values", nargs="*", help="key=value of the statistic's keys")
    switches = sub.add_parser("switches", help="show or change runtime switches")
    switches.add_argument("--admin", default=admin_default)
    switches.add_argument("--shadow-mode", choices=["on", "off"])
    switches.add_argument("--limiting-off", choices=["on", "off"])
    switches.add_argument("--shadow-domains", help="comma-separated domains ('' for none)")
    cache = sub.add_parser("cache", help="response cache administration")
    cache_sub = cache.add_subparsers(dest="cache_command", required=True)
    purge = cache_sub.add_parser("purge", help="drop every entry of one API (O(1))")
    purge.add_argument("--api", required=True)
    purge.add_argument("--admin", "--admin-url", dest="admin", default=admin_default)
    demo = sub.add_parser("demo", help="start Envoy + rls + a tiny backend locally")
    demo.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def cache_files_in(paths: Sequence[str]) -> list[str]:
    """Cache rule files inside the given directories (discover() leaves them out)."""
    return [
        f for p in paths if os.path.isdir(p) for f in yaml_files_under(p) if is_cache_file(f)
    ]


def check_config(paths: Sequence[str], merge_domains: bool) -> int:
    """Validate every file; print `file: message` per error; exit 1 on any error."""
    errors = 0
    files: list[tuple[str, str]] = []
    try:
        names = discover(paths) + cache_files_in(paths)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    for name in names:
        try:
            if is_cache_file(name):
                check_cache_file(name)
                continue
            text = read_text(name)
            load_files([(name, text)], merge_domains=True)
            files.append((name, text))
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            errors += 1
    if not errors:
        try:  # cross-file conditions: duplicate domains, duplicate nodes when merging
            config = load_files(files, merge_domains)
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            return 1
        cache_count = len(names) - len(files)
        print(
            f"OK: {len(files)} descriptor file(s), {len(config.domains)} domain(s), "
            f"{cache_count} cache rules file(s)"
        )
    return 1 if errors else 0


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

    try:
        if args.command == "counters":
            if args.add is not None:
                return client.add(args.admin, args.domain, args.descriptor, args.add)
            return client.counters(args.admin, args.domain, args.descriptor)
        if args.command == "usage":
            return client.usage(args.admin, args.domain, args.values, args.day, args.distinct)
        changes: dict[str, object] = {}
        if args.shadow_mode:
            changes["shadow_mode"] = args.shadow_mode == "on"
        if args.limiting_off:
            changes["limiting_off"] = args.limiting_off == "on"
        if args.shadow_domains is not None:
            changes["shadow_domains"] = [d for d in args.shadow_domains.split(",") if d]
        return client.switches(args.admin, changes)
    except (ValueError, OSError) as exc:
        return client.fail(str(exc))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "check-config":
        return check_config(args.paths, args.merge_domains)
    if args.command in ("counters", "usage", "switches"):
        return _admin_command(args)
    if args.command == "cache":
        from rls.cache.cli import purge

        return purge(args.admin, args.api, os.environ.get("RLS_ADMIN_TOKEN"))
    if args.command == "demo":
        from rls.demo import main as demo_main

        return demo_main(args.args)
    try:
        settings = _settings_from(args)
    except ValueError as exc:
        print(f"rls: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.log_level, settings.log_format)
    if settings.workers > 1:
        if not settings.redis_url:
            print(
                "rls: --workers > 1 needs --redis-url: the memory backend is per process and "
                "would multiply every limit by the number of workers",
                file=sys.stderr,
            )
            return 2
        from rls.workers import supervise

        argv = list(sys.argv[1:] if argv is None else argv)
        budget = settings.shutdown_delay_ms / 1000 + settings.drain_seconds + 5.0
        return supervise(_without_workers(argv), settings.workers, budget)
    from rls.server import serve

    try:
        return asyncio.run(serve(settings))
    except KeyboardInterrupt:
        return 0
