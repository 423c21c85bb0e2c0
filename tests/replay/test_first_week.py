"""Issue 33: what a first week with `rls replay` tripped over — an access log whose lines
start with `ts`, an empty replay's header."""

from __future__ import annotations

import json
from pathlib import Path

from rls.replay.report import render

from .logs import decision_log, envoy_line
from .test_replay import TRAFFIC, replay


def ts_first(line: str, ts: int) -> str:
    """The access log line with `ts` (ms) as its first member instead of `start_time`."""
    obj = json.loads(line)
    del obj["start_time"]
    return json.dumps({"ts": ts, **obj}, separators=(",", ":"))


def test_an_access_log_line_starting_with_ts_is_replayed_not_skipped(tmp_path: Path) -> None:
    log = tmp_path / "envoy.log"
    log.write_text("".join(ts_first(envoy_line(*r), r[0]) + "\n" for r in TRAFFIC))
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

