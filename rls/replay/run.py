"""One replay: a traffic log decided against a config (and a baseline's, side by side) on the
log's own timestamps, as fast as the CPU allows, into a report of who would be limited.

The log is read once, as a stream (reader.py); each request is decided by the fast path for
plain fixed windows or the service's engine (engines.py) and tallied (report.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from rls.config.errors import ConfigError
from rls.config.loader import load_paths
from rls.replay.engines import NOT_LIMITED, Replayer
from rls.replay.reader import LogReader, open_log
from rls.replay.report import Tally


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


def replay_log(
    config: Sequence[str],
    log: str,
    baseline: Sequence[str] = (),
    *,
    merge_domains: bool = False,
    fast: bool = True,
    fail_over_percent: float | None = None,
) -> tuple[int, dict[str, Any] | None, str]:
    """(exit status, report, error text) of replaying `log` against `config` (and `baseline`).

    Exit status: 0; 1 when `fail_over_percent` is exceeded (requests newly OVER_LIMIT against
    the baseline, else all OVER_LIMIT requests, as a percentage of the requests replayed; the
    report's `failed` says so); 2 for a config or log that cannot be read (no report)."""
    try:
        new_config = load_paths(config, merge_domains)
        base_config = load_paths(baseline, merge_domains) if baseline else None
    except ConfigError as exc:
        return 2, None, exc.detail()
    new = Replayer(new_config, 0, fast)
    base = Replayer(base_config, 1, fast) if base_config is not None else None
    tally = Tally(baseline=base is not None)
    started, cpu = time.perf_counter(), time.process_time()
    try:
        with open_log(log) as stream:
            reader = LogReader(stream)
            asyncio.run(replay(reader, new, base, tally))
    except (OSError, EOFError) as exc:  # gzip: a truncated member is EOFError
        return 2, None, f"{log}: {exc}"
    report = tally.as_json(
        reader.bad, reader.skipped, time.perf_counter() - started, time.process_time() - cpu,
        new.candidates if new.has_candidates else None,
    )
    status = 0
    if fail_over_percent is not None:
        share = (report["baseline"]["ok_to_over_limit_percent"] if base is not None
                 else report["over_limit_percent"])
        if share > fail_over_percent:
            status = 1
            report["failed"] = f"{share} % > --fail-over-percent {fail_over_percent}"
    return status, report, ""
