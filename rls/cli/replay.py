"""`rls replay --config DIR --log FILE [--baseline DIR] [--json] [--fail-over-percent N]`.

Decides every request of a traffic log with the config (and the baseline's, side by side) on
the log's own timestamps, offline (rls.replay). Prints who would be limited (a table, or JSON
with --json). Exit status: 0; 1 when --fail-over-percent is exceeded (requests newly
OVER_LIMIT against the baseline, else all OVER_LIMIT requests, as a percentage of the requests
replayed); 2 for a config or log that cannot be read. docs/changing-limits.md shows it in CI.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rls.cli.command import Call, SubParsers
from rls.replay.report import dumps, render
from rls.replay.run import replay_log

NAME = "replay"


def add_parser(sub: SubParsers) -> argparse.ArgumentParser:
    p = sub.add_parser(
        NAME, help="decide a traffic log against a config, offline",
        description="decide a traffic log (Envoy JSON access log or rls --decision-log, "
        "gzip or plain) against a config, offline, on the log's own timestamps",
    )
    p.add_argument("--config", action="append", required=True, metavar="PATH",
                   help="descriptor file or directory to replay against (repeatable)")
    p.add_argument("--log", required=True, metavar="FILE", help="the traffic log")
    p.add_argument("--baseline", action="append", default=[], metavar="PATH",
                   help="the config to compare with, e.g. the one in production (repeatable; "
                   "default: none)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--fail-over-percent", type=float, default=None, metavar="N",
                   help="exit 1 when more than N %% of the requests are OVER_LIMIT (with "
                   "--baseline: newly OVER_LIMIT) (default: never)")
    p.add_argument("--merge-domains", action="store_true",
                   help="allow one domain to span several files (default off)")
    p.add_argument("--general-engine", action="store_true",
                   help="decide every request with the service's engine, never the fast path "
                   "for plain fixed windows (slower; default off)")
    return p


def outcome(args: argparse.Namespace) -> tuple[int, dict[str, Any] | None, str]:
    """(exit status, report, error text) of `rls replay` as parsed."""
    return replay_log(
        args.config, args.log, args.baseline, merge_domains=args.merge_domains,
        fast=not args.general_engine, fail_over_percent=args.fail_over_percent,
    )


def run(args: argparse.Namespace, call: Call) -> int:
    status, report, error = outcome(args)
    if report is None:
        print(f"rls replay: {error}", file=sys.stderr)
        return status
    sys.stdout.write(dumps(report) if args.json else render(report))
    if "failed" in report:
        print(f"rls replay: FAILED: {report['failed']}", file=sys.stderr)
    return status
