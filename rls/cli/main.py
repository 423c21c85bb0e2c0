"""The `rls` command: its sub-commands, and `rls serve` from flags to a running service.

The serve flags live in rls.cli_flags, `check-config` in rls.check_config_cli; the admin
clients (`counters`, `usage`, `switches`, `cache`, `top`) call the admin API.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import logging
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from rls import check_config_cli
from rls.admin.cache_cli import add_parser as add_cache_parser
from rls.admin.cache_cli import command as cache_command
from rls.check_config_cli import check_config as check_config  # its callers import it here
from rls.check_config_cli import empty_directories
from rls.cli_flags import FLAGS as FLAGS  # the flag help table (tests and docs read it here)
from rls.cli_flags import add_serve_flags
from rls.cli_flags import settings_from as _settings_from
from rls.cli_hints import parse_args
from rls.config.errors import ConfigError
from rls.config.loader import load_paths, missing_reason
from rls.config.reload import check_config_command, problems_line
from rls.event_loop import loop_factory
from rls.logging_setup import setup_logging
from rls.settings import Settings, admin_token, env_value
from rls.tls import startup_problem as tls_startup_problem
from rls.top_cli import add_parser as add_top_parser
from rls.tracing import startup_problem as tracing_startup_problem

ADMIN_URL_DEFAULT = "http://127.0.0.1:8080"


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
    add_serve_flags(serve)
    check_config_cli.add_parser(sub)
    _add_admin_commands(sub)
    # `rls demo ...` is handed to rls.demo's own parser before this one runs (see main), so
    # `rls demo --help` shows the demo's options; this entry only lists it in `rls --help`.
    sub.add_parser("demo", help="start Envoy + rls + a tiny backend locally (rls demo --help)")
    sub.add_parser("replay", help="decide a traffic log against a config, offline "
                   "(rls replay --help)")
    return parser


def _add_admin_commands(sub: Any) -> None:
    """The sub-commands that call a running rls's admin API."""
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
        return check_config_cli.command(parser, args)
    if args.command in ("counters", "usage", "switches", "cache"):
        return _admin_command(args)
    if args.command == "top":
        from rls.top_cli import main as top_main

        return top_main(args)
    return _serve(args, argv, notes)


def _serve(args: argparse.Namespace, argv: list[str], notes: Sequence[tuple[int, str]]) -> int:
    """`rls serve`: settings, the start-up checks, logging, then one process or the workers."""
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
        return _supervise(settings, argv)
    from rls.server import serve

    try:
        with asyncio.Runner(loop_factory=loop_factory(settings.loop)) as runner:
            return runner.run(serve(settings))
    except KeyboardInterrupt:
        return 0


def _workers_problem(settings: Settings) -> tuple[int, str] | None:
    """(exit code, line) when `--workers` must not start: checked once here, as a worker that
    cannot load the config would exit and be restarted forever by the supervisor."""
    try:
        config = load_paths(settings.config, settings.merge_domains)
    except ConfigError as exc:
        command = check_config_command(settings.config, settings.merge_domains, settings.strict)
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
    from rls.workers import supervise

    budget = settings.shutdown_delay_ms / 1000 + settings.drain_seconds + 5.0
    return supervise(
        _without_workers(argv), settings.workers, budget,
        max_failures=settings.worker_max_failures,
    )
