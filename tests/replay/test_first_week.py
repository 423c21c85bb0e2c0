"""Issue 33: what a first week with `rls replay` tripped over: an access log whose lines
start with `ts`, an empty replay's header, candidate limits (reported as production counts
them, against a reference model)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rls.engine.decision import DescriptorIn
from rls.replay.report import render

from .logs import T0, decision_log, envoy_line, user
from .test_replay import TRAFFIC, replay


def ts_first(line: str, ts: int) -> str:
    """The access log line with `ts` (ms) as its first member instead of `start_time`."""
    obj = json.loads(line)
    del obj["start_time"]
    return json.dumps({"ts": ts, **obj}, separators=(",", ":"))


def ts_and_code_first(line: str, ts: int) -> str:
    """A format of one's own with `ts` then a string `code` first (the decision log's first two
    members), the request in a member."""
    obj = json.loads(ts_first(line, ts))
    return json.dumps({"ts": obj.pop("ts"), "code": "200", **obj}, separators=(",", ":"))


@pytest.mark.parametrize("shape", [ts_first, ts_and_code_first])
def test_an_access_log_line_starting_with_ts_is_replayed_not_skipped(
        tmp_path: Path, shape: Callable[[str, int], str]) -> None:
    log = tmp_path / "envoy.log"
    log.write_text("".join(shape(envoy_line(*r), r[0]) + "\n" for r in TRAFFIC))
    assert log.read_text().startswith('{"ts":')
    _, from_envoy = replay(tmp_path, log)
    _, from_rls = replay(tmp_path, decision_log(tmp_path / "d.jsonl", TRAFFIC))
    assert from_envoy["skipped_lines"] == 0 and from_envoy["bad_lines"]["total"] == 0
    for key in ("requests", "over_limit", "limits", "limited", "from", "to"):
        assert from_envoy[key] == from_rls[key], key
    assert from_envoy["logged_answers"]["lines"] == len(TRAFFIC)  # overallCode read


def test_an_empty_replay_says_so_without_none_times(tmp_path: Path) -> None:
    log = tmp_path / "empty.log"
    log.write_text('{"path":"/health","response_code":200}\n')
    _, report = replay(tmp_path, log)
    assert report["requests"] == 0 and report["from"] is None
    text = render(report)
    assert "None" not in text
    assert text.startswith("rls replay: 0 requests in ")



CANDIDATES = """\
domain: app
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
    candidates:
      - {name: halve, requests_per_unit: 2}
      - {name: same, requests_per_unit: 5}
"""
CAPS = {"": 5, "halve": 2, "same": 5}  # the live limit, then each candidate


def candidate_traffic(seed: int, n: int) -> list[tuple[int, str, list[DescriptorIn], int]]:
    """Single-descriptor requests of five users over three minutes, 0 to 2 hits each."""
    rng = random.Random(seed)
    times = sorted(T0 + rng.randrange(180_000) for _ in range(n))
    return [(ts, "app", [user(rng.choice("abcde"))], rng.choice((0, 1, 2))) for ts in times]


def reference(traffic: list[tuple[int, str, list[DescriptorIn], int]]) -> dict[str, Any]:
    """Each limit as a plain fixed window on its own (a candidate is charged as the live limit
    would be in its place; a rejected request charges nothing; near: past 80 % after it)."""
    used: dict[tuple[str, str, int], int] = {}
    totals = {name: [0, 0, 0, None, None] for name in CAPS if name}
    who: dict[tuple[str, str], list[Any]] = {}
    live_over = 0
    for ts, _, descs, hits in traffic:
        h = max(hits, 1)
        name_of = descs[0].entries[0][1]
        for cand, cap in CAPS.items():
            key = (cand, name_of, ts // 60_000)
            over = used.get(key, 0) + h > cap
            near = not over and used.get(key, 0) + h > int(cap * 0.8)
            if not over:
                used[key] = used.get(key, 0) + h
            if not cand:
                live_over += over
                continue
            row = totals[cand]
            row[0] += 1
            row[1] += over
            row[2] += near
            if over or near:
                row[3] = row[3] if row[3] is not None else ts
                row[4] = ts
                w = who.setdefault((cand, f"user={name_of}"), [0, 0, ts, ts])
                w[0 if over else 1] += h
                w[3] = ts
    return {"live_over": live_over, "totals": totals, "who": who}


def iso(ts: int | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts / 1000, UTC).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_replay_reports_each_candidate_as_production_counts_it(tmp_path: Path, seed: int) -> None:
    traffic = candidate_traffic(seed, 400)
    status, report = replay(tmp_path, decision_log(tmp_path / "d.jsonl", traffic),
                            config=CANDIDATES)
    want = reference(traffic)
    assert status == 0 and report["over_limit"] == want["live_over"]  # answers unchanged
    got = {r["candidate"]: [r["checks"], r["over_limit"], r["near_limit"], r["first"],
                            r["last"]] for r in report["candidates"]}
    assert got == {c: [*v[:3], iso(v[3]), iso(v[4])] for c, v in want["totals"].items()}
    assert all(r["limit"] == "app.user" and r["domain"] == "app" for r in report["candidates"])
    assert got["halve"][1] > got["same"][1] > 0  # the traffic reaches both
    assert got["same"][1] == want["live_over"]  # a candidate equal to the live limit
    rows = {(r["candidate"], r["descriptor"]): [r["over_limit"], r["near_limit"],
                                                r["first"], r["last"]]
            for r in report["candidates_limited"]}
    assert rows == {k: [v[0], v[1], iso(v[2]), iso(v[3])] for k, v in want["who"].items()}
    text = render(report)
    assert "app.user: halve" in text and "WHO CANDIDATES LIMIT" in text


def test_a_config_without_candidates_reports_none(tmp_path: Path) -> None:
    _, report = replay(tmp_path, decision_log(tmp_path / "d.jsonl", TRAFFIC))
    assert "candidates" not in report and "candidates_limited" not in report


def caps(lower: int, higher: int, route_lower: int, route_higher: int) -> dict[str, int]:
    """Per descriptor its limit a minute: users a-c and route /a get `lower`, the others
    `higher` (swapping the arguments gives the other config: some limits up, some down)."""
    out = {f"user={u}": lower for u in "abc"} | {f"user={u}": higher for u in "def"}
    return out | {"route=/a": route_lower, "route=/b": route_higher}


BASE_CAPS, NEW_CAPS = caps(5, 3, 16, 10), caps(3, 5, 10, 16)


def config(limits: dict[str, int]) -> str:
    lines = ["domain: app", "descriptors:"]
    for text, cap in limits.items():
        key, value = text.split("=")
        lines += [f"  - key: {key}", f"    value: {value!r}",
                  f"    rate_limit: {{unit: minute, requests_per_unit: {cap}}}"]
    return "\n".join(lines) + "\n"


def two_descriptor_traffic(seed: int, n: int) -> list[tuple[int, str, list[DescriptorIn], int]]:
    """Requests of a user on a route (two descriptors each) over three minutes."""
    rng = random.Random(seed)
    times = sorted(T0 + rng.randrange(180_000) for _ in range(n))
    return [(ts, "app", [user(rng.choice("abcdef")),
                         DescriptorIn((("route", rng.choice(("/a", "/b"))),))], 0)
            for ts in times]


def verdicts(traffic: list[tuple[int, str, list[DescriptorIn], int]],
             limits: dict[str, int]) -> list[set[str]]:
    """Per request, the descriptors over their limit (empty: admitted); plain fixed windows,
    the whole request charged only when every counter has room."""
    used: dict[tuple[str, int], int] = {}
    out = []
    for ts, _, descs, _ in traffic:
        keys = [(f"{d.entries[0][0]}={d.entries[0][1]}", ts // 60_000) for d in descs]
        over = {key[0] for key in keys if used.get(key, 0) >= limits[key[0]]}
        if not over:
            for key in keys:
                used[key] = used.get(key, 0) + 1
        out.append(over)
    return out


@pytest.mark.parametrize("engine", [(), ("--general-engine",)], ids=["fast", "general"])
def test_the_changed_table_counts_requests_that_changed_per_descriptor_limiting_them(
    tmp_path: Path, engine: tuple[str, ...]
) -> None:
    traffic = two_descriptor_traffic(5, 200)
    base_dir = tmp_path / "base"
    base_dir.mkdir()
    (base_dir / "app.yaml").write_text(config(BASE_CAPS))
    _, report = replay(tmp_path, decision_log(tmp_path / "d.jsonl", traffic),
                       "--baseline", str(base_dir), *engine, config=config(NEW_CAPS))
    rows: dict[str, list[int]] = {}
    header = [0, 0]
    several = [0, 0]  # changed requests limited by both descriptors on their OVER side
    flips_only = 0  # requests over in both configs, by different descriptors
    for now, before in zip(verdicts(traffic, NEW_CAPS), verdicts(traffic, BASE_CAPS),
                           strict=True):
        if bool(now) == bool(before):
            flips_only += bool(now) and now != before
            continue
        col, limiting = (0, now) if now else (1, before)
        header[col] += 1
        several[col] += len(limiting) > 1
        for text in limiting:
            rows.setdefault(text, [0, 0])[col] += 1
    base = report["baseline"]
    assert [base["ok_to_over_limit"], base["over_limit_to_ok"]] == header
    got = {c["descriptor"]: [c["ok_to_over_limit"], c["over_limit_to_ok"]]
           for c in base["changes"]}
    assert got == rows
    # The rows add up to the header, plus once more per request limited by both descriptors.
    for col in (0, 1):
        assert sum(r[col] for r in got.values()) == header[col] + several[col]
    assert header[0] and header[1] and flips_only and sum(several)  # every case occurs


DOCS = Path(__file__).resolve().parents[2] / "docs" / "changing-limits.md"


def key_names(value: Any, dynamic: frozenset[str] = frozenset({"by_reason",
                                                               "first_line_numbers"})) -> set[str]:
    """Every key of a JSON report, nested ones too (not the reasons used as keys)."""
    if isinstance(value, list):
        return set().union(*(key_names(v) for v in value)) if value else set()
    if not isinstance(value, dict):
        return set()
    out = set(value)
    for name, inner in value.items():
        if name not in dynamic:
            out |= key_names(inner)
    return out


def test_every_key_of_the_json_report_is_documented(tmp_path: Path) -> None:
    traffic = candidate_traffic(1, 200)
    base_dir = tmp_path / "base"
    base_dir.mkdir()
    (base_dir / "app.yaml").write_text(CANDIDATES)
    log = decision_log(tmp_path / "d.jsonl", traffic)
    log.write_text(log.read_text() + "not json\n")
    lower = CANDIDATES.replace("requests_per_unit: 5}", "requests_per_unit: 4}", 1)
    status, report = replay(tmp_path, log, "--baseline", str(base_dir),
                            "--fail-over-percent", "0", config=lower)
    assert status == 1
    for part in ("candidates", "candidates_limited", "logged_answers", "baseline", "failed"):
        assert report[part], part
    assert report["baseline"]["changes"] and report["limited"]
    text = DOCS.read_text()
    table = text[text.index("`--json` prints the same report as one object"):]
    undocumented = sorted(k for k in key_names(report) if f"`{k}`" not in table)
    assert undocumented == []

