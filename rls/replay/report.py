"""What a replay found: who would be limited, when and by which limit; what changed against
the baseline config; how replay agreed with the answers the log recorded. Bounded: at most
MAX_ROWS (descriptor, limit) rows and MAX_ROWS changed descriptors are kept, the rest are
summed into one `(other descriptors)` row, so memory does not grow with the log.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from rls.replay.candidates import CandidateTally
from rls.replay.engines import Result
from rls.replay.reader import BadLines, Shape

MAX_ROWS = 10_000
OTHER = "(other descriptors)"
SHOWN = 20  # rows per table in the terminal


def _iso(ts: int | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts / 1000, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z"
    )


def _bump(table: dict[Any, list[int]], key: Any, ts: int, cells: int, col: int) -> None:
    """Add 1 to column `col` of a row [counts..., first ts, last ts], overflowing to OTHER."""
    row = table.get(key)
    if row is None:
        if len(table) >= MAX_ROWS:
            key = (OTHER,) * len(key) if isinstance(key, tuple) else OTHER
            row = table.get(key)
        if row is None:
            row = table[key] = [0] * cells + [ts, ts]
    row[col] += 1
    row[-2] = min(row[-2], ts)
    row[-1] = max(row[-1], ts)


class Tally:
    def __init__(self, baseline: bool = False) -> None:
        self.baseline = baseline
        self.requests = 0
        self.over = 0
        self._first = 1 << 62
        self._last = -(1 << 62)
        self.limits: dict[str, list[int]] = {}  # limit -> [over, first, last]
        self.who: dict[tuple[str, str, str], list[int]] = {}  # (domain, descriptor, limit)
        self.logged = self.agree = 0  # lines with the live answer; replay gave the same
        self.disagree_first: list[tuple[int, str]] = []
        self.base_over = self.ok_to_over = self.over_to_ok = 0
        # (domain, descriptor) -> [OK->OVER, OVER->OK, first, last]: requests that changed
        self.changes: dict[tuple[str, str], list[int]] = {}

    def add(self, ts: int, code: str | None, shape: Shape, result: Result,
            base: Result | None = None) -> None:
        self.requests += 1
        if ts > self._last:
            self._last = ts
        if ts < self._first:
            self._first = ts
        over, overs = result
        if over:
            self.over += 1
        for i, limit in overs:
            _bump(self.limits, limit, ts, 1, 0)
            _bump(self.who, (shape.domain, shape.texts[i], limit), ts, 1, 0)
        if code is not None:
            self.logged += 1
            if (code == "OVER_LIMIT") == over:
                self.agree += 1
            elif len(self.disagree_first) < 5:
                self.disagree_first.append((ts, code))
        if base is not None:
            self._compare(ts, shape, result, base)

    def add_admitted(self, n: int, logged: int, first: int, last: int) -> None:
        """`n` requests replay admitted, `logged` of them logged as admitted too (what `add`
        would have counted one by one), between `first` and `last`."""
        if not n:
            return
        self.requests += n
        self.logged += logged
        self.agree += logged
        self._first = min(self._first, first)
        self._last = max(self._last, last)

    def _compare(self, ts: int, shape: Shape, result: Result, base: Result) -> None:
        """A request whose answer changed counts once in the header's count, and once in the
        row of each descriptor that limits it on its OVER_LIMIT side (OK -> OVER: over the
        config's limit; OVER -> OK: over the baseline's). A request still OVER_LIMIT, for
        another descriptor, did not change (docs/changing-limits.md)."""
        if base[0]:
            self.base_over += 1
        if result[0] == base[0]:
            return
        if result[0]:
            self.ok_to_over += 1
            col, overs = 0, result[1]
        else:
            self.over_to_ok += 1
            col, overs = 1, base[1]
        for text in {shape.texts[i] for i, _ in overs}:
            _bump(self.changes, (shape.domain, text), ts, 2, col)

    @property
    def first(self) -> int | None:
        return self._first if self.requests else None

    @property
    def last(self) -> int | None:
        return self._last if self.requests else None

    def percent(self, n: int) -> float:
        return round(100.0 * n / self.requests, 4) if self.requests else 0.0

    def as_json(
        self, bad: BadLines, skipped: int, seconds: float, cpu: float,
        candidates: CandidateTally | None = None,
    ) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests": self.requests,
            "over_limit": self.over,
            "over_limit_percent": self.percent(self.over),
            "from": _iso(self.first),
            "to": _iso(self.last),
            "bad_lines": {"total": bad.total, "by_reason": bad.by_reason,
                          "first_line_numbers": bad.examples},
            "skipped_lines": skipped,
            "seconds": round(seconds, 3),
            "decisions_per_cpu_second": round(self.requests / cpu) if cpu > 0 else None,
            "limits": [
                {"limit": k, "over_limit": v[0], "first": _iso(v[1]), "last": _iso(v[2])}
                for k, v in sorted(self.limits.items(), key=lambda kv: (-kv[1][0], kv[0]))
            ],
            "limited": [
                {"domain": d, "descriptor": t, "limit": lim, "over_limit": v[0],
                 "first": _iso(v[1]), "last": _iso(v[2])}
                for (d, t, lim), v in sorted(self.who.items(), key=lambda kv: (-kv[1][0], kv[0]))
            ],
        }
        if candidates is not None:  # the config has candidate limits
            out.update(candidates.as_json(_iso))
        if self.logged:
            out["logged_answers"] = {
                "lines": self.logged, "same": self.agree, "different": self.logged - self.agree,
                "first_different": [{"ts": _iso(t), "logged": c} for t, c in self.disagree_first],
            }
        if self.baseline:
            out["baseline"] = {
                "over_limit": self.base_over,
                "over_limit_percent": self.percent(self.base_over),
                "ok_to_over_limit": self.ok_to_over,
                "ok_to_over_limit_percent": self.percent(self.ok_to_over),
                "over_limit_to_ok": self.over_to_ok,
                "changes": [
                    {"domain": d, "descriptor": t, "ok_to_over_limit": v[0],
                     "over_limit_to_ok": v[1], "first": _iso(v[2]), "last": _iso(v[3])}
                    for (d, t), v in sorted(self.changes.items(),
                                            key=lambda kv: (-kv[1][0] - kv[1][1], kv[0]))
                ],
            }
        return out


def render(report: dict[str, Any]) -> str:
    """The terminal tables of `as_json`'s report."""
    bad = report["bad_lines"]
    rate = report["decisions_per_cpu_second"]
    span = f" from {report['from']} to {report['to']}" if report["requests"] else ""
    lines = [
        f"rls replay: {report['requests']:,} requests{span} "
        f"in {report['seconds']} s" + (f" ({rate:,} decisions per CPU second)" if rate else ""),
        f"bad lines: {bad['total']:,}"
        + (" (" + ", ".join(f"{r}: {n:,} e.g. line {bad['first_line_numbers'][r][0]}"
                            for r, n in sorted(bad["by_reason"].items())) + ")"
           if bad["total"] else "")
        + f"; lines without rate-limit data: {report['skipped_lines']:,}",
        f"OVER_LIMIT: {report['over_limit']:,} requests ({report['over_limit_percent']} %)",
    ]
    logged = report.get("logged_answers")
    if logged:
        lines.append(f"answers in the log: {logged['lines']:,}, replay agrees on "
                     f"{logged['same']:,}, differs on {logged['different']:,}")
    if report["limits"]:
        lines += ["", f"{'LIMIT':<40} {'OVER':>10}  {'FIRST':<24}  LAST"]
        lines += [f"{r['limit'][:40]:<40} {r['over_limit']:>10}  {r['first']:<24}  {r['last']}"
                  for r in report["limits"][:SHOWN]]
        lines += ["", f"{'WHO (domain: descriptor)':<40} {'OVER':>10}  {'LIMIT':<30}  "
                  "FIRST .. LAST"]
        lines += [
            f"{(r['domain'] + ': ' + r['descriptor'])[:40]:<40} {r['over_limit']:>10}  "
            f"{r['limit'][:30]:<30}  {r['first']} .. {r['last']}"
            for r in report["limited"][:SHOWN]
        ]
        if len(report["limited"]) > SHOWN:
            lines.append(f"... {len(report['limited']) - SHOWN} more (--json for all)")
    lines += _candidate_lines(report)
    base = report.get("baseline")
    if base is not None:
        lines += [
            "",
            f"against the baseline: {base['ok_to_over_limit']:,} requests OK -> OVER_LIMIT "
            f"({base['ok_to_over_limit_percent']} %), {base['over_limit_to_ok']:,} "
            f"OVER_LIMIT -> OK (baseline OVER_LIMIT: {base['over_limit']:,})",
        ]
        if base["changes"]:
            lines.append(f"{'CHANGED (domain: descriptor)':<40} {'OK->OVER':>10} "
                         f"{'OVER->OK':>10}  FIRST .. LAST")
            lines += [
                f"{(r['domain'] + ': ' + r['descriptor'])[:40]:<40} "
                f"{r['ok_to_over_limit']:>10} {r['over_limit_to_ok']:>10}  "
                f"{r['first']} .. {r['last']}"
                for r in base["changes"][:SHOWN]
            ]
    return "\n".join(lines) + "\n"


def _candidate_lines(report: dict[str, Any]) -> list[str]:
    """The candidate tables: per candidate limit, then who each would have limited."""
    if not report.get("candidates"):
        return []
    lines = ["", f"{'CANDIDATE (limit: candidate)':<40} {'CHECKS':>10} {'OVER':>10} "
             f"{'NEAR':>10}  FIRST .. LAST"]
    lines += [
        f"{(r['limit'] + ': ' + r['candidate'])[:40]:<40} {r['checks']:>10} "
        f"{r['over_limit']:>10} {r['near_limit']:>10}  {r['first']} .. {r['last']}"
        for r in report["candidates"][:SHOWN]
    ]
    who = report["candidates_limited"]
    if who:
        lines += ["", f"{'WHO CANDIDATES LIMIT (domain: descriptor)':<40} {'OVER':>10} "
                  f"{'NEAR':>10}  {'CANDIDATE (limit: candidate)':<30}  FIRST .. LAST"]
        lines += [
            f"{(r['domain'] + ': ' + r['descriptor'])[:40]:<40} {r['over_limit']:>10} "
            f"{r['near_limit']:>10}  {(r['limit'] + ': ' + r['candidate'])[:30]:<30}  "
            f"{r['first']} .. {r['last']}"
            for r in who[:SHOWN]
        ]
        if len(who) > SHOWN:
            lines.append(f"... {len(who) - SHOWN} more (--json for all)")
    return lines


def dumps(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=1) + "\n"
