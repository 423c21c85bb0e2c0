"""`rls replay --config DIR --log FILE [--baseline DIR] [--json] [--fail-over-percent N]`.

Reads the log once, as a stream, and decides every request with the config (and the
baseline's, side by side) on the log's own timestamps, as fast as the CPU allows. Prints who
would be limited (a table, or JSON with --json). Exit status: 0; 1 when --fail-over-percent
is exceeded (requests newly OVER_LIMIT against the baseline, else all OVER_LIMIT requests,
as a percentage of the requests replayed); 2 for a config or log that cannot be read.
docs/changing-limits.md shows it in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Any

from rls.config.errors import ConfigError
from rls.config.loader import load_paths
from rls.replay.engines import NOT_LIMITED, Replayer
from rls.replay.reader import LogReader, open_log
from rls.replay.report import Tally, dumps, render


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
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


async def replay(
    reader: LogReader, new: Replayer, base: Replayer | None, tally: Tally
) -> None:
    """Every request of the log, decided in log order. The fast path is called directly, and
    requests it admits that the log also says were admitted (most of them) are tallied in
    bulk: this loop is where replay spends its time."""
    fast_new, fast_domains, general = new.fast.decide, new.fast_domains, new.general.decide
    add = tally.add
    admitted = logged = 0
    first, last = 1 << 62, -(1 << 62)
    for ts, code, shape in reader:
        if shape.domain in fast_domains:
            result = fast_new(ts, shape)
        else:
            result = await general(ts, shape)
        if base is not None:
            add(ts, code, shape, result, await base.decide(ts, shape))
        elif result is NOT_LIMITED and code != "OVER_LIMIT":
            admitted += 1
            if code is not None:
                logged += 1
            if ts > last:
                last = ts
            if ts < first:
                first = ts
        else:
            add(ts, code, shape, result)
    tally.add_admitted(admitted, logged, first, last)


def run(args: argparse.Namespace) -> tuple[int, dict[str, Any] | None, str]:
    """(exit status, report, error text)."""
    try:
        config = load_paths(args.config, args.merge_domains)
        baseline = load_paths(args.baseline, args.merge_domains) if args.baseline else None
    except ConfigError as exc:
        return 2, None, exc.detail()
    fast = not args.general_engine
    new = Replayer(config, 0, fast)
    base = Replayer(baseline, 1, fast) if baseline is not None else None
    tally = Tally(baseline=base is not None)
    started, cpu = time.perf_counter(), time.process_time()
    try:
        with open_log(args.log) as stream:
            reader = LogReader(stream)
            asyncio.run(replay(reader, new, base, tally))
    except (OSError, EOFError) as exc:  # gzip: a truncated member is EOFError
        return 2, None, f"{args.log}: {exc}"
    report = tally.as_json(
        reader.bad, reader.skipped, time.perf_counter() - started, time.process_time() - cpu,
        new.candidates if new.has_candidates else None,
    )
    status = 0
    if args.fail_over_percent is not None:
        share = (report["baseline"]["ok_to_over_limit_percent"] if base is not None
                 else report["over_limit_percent"])
        if share > args.fail_over_percent:
            status = 1
            report["failed"] = f"{share} % > --fail-over-percent {args.fail_over_percent}"
    return status, report, ""


def main(argv: Sequence[str], prog: str = "rls replay") -> int:
    args = _parser(prog).parse_args(list(argv))
    status, report, error = run(args)
    if report is None:
        print(f"rls replay: {error}", file=sys.stderr)
        return status
    sys.stdout.write(dumps(report) if args.json else render(report))
    if "failed" in report:
        print(f"rls replay: FAILED: {report['failed']}", file=sys.stderr)
    return status
