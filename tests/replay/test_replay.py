"""`rls replay` on logs whose right answer is known: who is limited, when, by which limit; the
difference with a baseline; both log formats, gzip, bad lines; the exit status for CI."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from rls.cli.main import main as rls_main
from rls.cli.main import parser
from rls.cli.replay import outcome

from .logs import T0, decision_log, envoy_line, user

CONFIG = """\
domain: app
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: api
    value: search
    rate_limit: {name: search, unit: second, requests_per_unit: 1}
"""
# The same domain with the user limit lowered to 2 a minute.
LOWER = CONFIG.replace("requests_per_unit: 3", "requests_per_unit: 2")

# alice: 5 calls in minute 0 (calls 4 and 5 over 3/minute), 2 in minute 1 (within);
# bob: 3 calls in minute 0 (within 3, the third over 2); carol: one call of 4 hits (over 3).
TRAFFIC = [
    *[(T0 + i * 1000, "app", [user("alice")], 0) for i in range(5)],
    *[(T0 + 60_000 + i * 1000, "app", [user("alice")], 0) for i in range(2)],
    *[(T0 + 500 + i * 1000, "app", [user("bob")], 0) for i in range(3)],
    (T0 + 30_000, "app", [user("carol")], 4),
]
TRAFFIC.sort(key=lambda r: r[0])


def replay(tmp_path: Path, log: Path, *extra: str, config: str = CONFIG) -> tuple[int, dict]:
    conf = tmp_path / "conf"
    conf.mkdir(exist_ok=True)
    (conf / "app.yaml").write_text(config)
    args = parser().parse_args(["replay", "--config", str(conf), "--log", str(log), *extra])
    status, report, error = outcome(args)
    assert report is not None, error
    return status, report


def test_replay_names_who_is_limited_when_and_by_which_limit(tmp_path: Path) -> None:
    status, report = replay(tmp_path, decision_log(tmp_path / "d.jsonl", TRAFFIC))
    assert status == 0
    assert report["requests"] == 11 and report["over_limit"] == 3
    assert report["from"] == "2026-01-01T00:00:00.000Z"
    assert report["to"] == "2026-01-01T00:01:01.000Z"
    assert report["limits"] == [{"limit": "app.user", "over_limit": 3,
                                 "first": "2026-01-01T00:00:03.000Z",
                                 "last": "2026-01-01T00:00:30.000Z"}]
    who = {(r["descriptor"], r["over_limit"], r["first"], r["last"]) for r in report["limited"]}
    assert who == {("user=alice", 2, "2026-01-01T00:00:03.000Z", "2026-01-01T00:00:04.000Z"),
                   ("user=carol", 1, "2026-01-01T00:00:30.000Z", "2026-01-01T00:00:30.000Z")}
    assert report["logged_answers"]["different"] == 3  # the log says all were OK
    assert report["bad_lines"]["total"] == 0


def test_the_envoy_access_log_format_gives_the_same_answer(tmp_path: Path) -> None:
    log = tmp_path / "envoy.log"
    log.write_text("".join(envoy_line(*r) + "\n" for r in TRAFFIC))
    _, from_envoy = replay(tmp_path, log)
    _, from_rls = replay(tmp_path, decision_log(tmp_path / "d.jsonl", TRAFFIC))
    for key in ("requests", "over_limit", "limits", "limited", "from", "to"):
        assert from_envoy[key] == from_rls[key], key


def test_a_baseline_shows_the_requests_that_change_per_descriptor(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "app.yaml").write_text(CONFIG)
    log = decision_log(tmp_path / "d.jsonl", TRAFFIC)
    status, report = replay(tmp_path, log, "--baseline", str(base), config=LOWER)
    assert status == 0
    diff = report["baseline"]
    # 2/minute rejects alice's 3rd (her 4th and 5th were over 3 already) and bob's 3rd.
    assert (diff["over_limit"], report["over_limit"]) == (3, 5)
    assert (diff["ok_to_over_limit"], diff["over_limit_to_ok"]) == (2, 0)
    changes = {(c["descriptor"], c["ok_to_over_limit"], c["over_limit_to_ok"])
               for c in diff["changes"]}
    assert changes == {("user=alice", 1, 0), ("user=bob", 1, 0)}
    assert diff["ok_to_over_limit_percent"] == pytest.approx(100 * 2 / 11, abs=1e-3)


def test_bad_and_partial_lines_are_counted_and_skipped_never_fatal(tmp_path: Path) -> None:
    good = decision_log(tmp_path / "d.jsonl", TRAFFIC).read_bytes().splitlines(keepends=True)
    log = tmp_path / "mixed.jsonl"
    log.write_bytes(
        good[0] + b"not json at all\n" + good[1] + b"\xff\xfe\n" + b"[1, 2]\n"
        + b'{"ts":12x,"code":"OK","domain":"app"}\n'
        + b'{"start_time":"yesterday","ratelimit":{"domain":"app","descriptors":[]}}\n'
        + b'{"start_time":"2026-01-01T00:00:00Z","ratelimit":{"domain":"app",'
        b'"descriptors":[{"entries":[7]}]}}\n'
        + b'{"path":"/health","response_code":200}\n'  # a request Envoy did not check
        + b"".join(good[2:]) + good[0][:25]  # cut short, no newline
    )
    status, report = replay(tmp_path, log)
    assert status == 0 and report["requests"] == 11
    bad = report["bad_lines"]
    assert bad["by_reason"] == {
        "not JSON (or cut short)": 2, "not UTF-8": 1, "not a JSON object": 1,
        "bad decision log line": 1, "an entry that is neither [key, value] nor \"key=value\"": 1,
    }
    assert bad["first_line_numbers"]["not JSON (or cut short)"] == [2, 19]
    assert report["skipped_lines"] == 2  # no descriptors, no rate-limit data


def test_infinite_far_or_deeply_nested_lines_are_bad_lines_not_a_traceback(
    tmp_path: Path,
) -> None:
    """`"ts": 1e400` (inf), a decision-log `ts` past year 9999 and `[[[…` used to end the
    replay with OverflowError / RecursionError; they are bad lines like the others."""
    good = decision_log(tmp_path / "d.jsonl", TRAFFIC).read_bytes().splitlines(keepends=True)
    request = b'"domain":"app","descriptors":[{"entries":[["user","x"]]}]'
    log = tmp_path / "hostile.jsonl"
    log.write_bytes(
        b"".join(good)
        + b'{"ts":1e400,' + request + b"}\n"
        + b'{"start_time":1e400,"ratelimit":{' + request + b"}}\n"
        + b'{"ts":99999999999999999999999,"code":"OK",' + request + b"}\n"
        + b'{"ts":-5,"code":"OK",' + request + b"}\n"
        + b"[" * 50_000 + b"\n"
    )
    status, report = replay(tmp_path, log)
    assert status == 0 and report["requests"] == len(TRAFFIC)
    assert report["bad_lines"]["by_reason"] == {
        "unreadable ts": 1, "unreadable start_time": 1, "timestamp out of range": 2,
        "JSON nested too deep": 1,
    }


def test_a_gzipped_log_is_read_as_a_stream(tmp_path: Path) -> None:
    plain = decision_log(tmp_path / "d.jsonl", TRAFFIC)
    packed = tmp_path / "d.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert replay(tmp_path, packed)[1]["limited"] == replay(tmp_path, plain)[1]["limited"]


def test_fail_over_percent_fails_ci_when_too_many_requests_would_be_limited(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "app.yaml").write_text(LOWER)
    base = tmp_path / "base"
    base.mkdir()
    (base / "app.yaml").write_text(CONFIG)
    log = decision_log(tmp_path / "d.jsonl", TRAFFIC)
    argv = ["replay", "--config", str(conf), "--baseline", str(base), "--log", str(log)]
    assert rls_main([*argv, "--fail-over-percent", "20"]) == 0  # 18.2 % newly limited
    capsys.readouterr()
    assert rls_main([*argv, "--fail-over-percent", "10", "--json"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["failed"].startswith("18.1818 % > --fail-over-percent 10")
    assert "FAILED" in err
    assert rls_main([*argv]) == 0
    table = capsys.readouterr().out
    assert "OK -> OVER_LIMIT" in table and "user=alice" in table and "app.user" in table


def test_an_unreadable_config_or_log_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("domain: app\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight}\n")
    log = decision_log(tmp_path / "d.jsonl", TRAFFIC)
    assert rls_main(["replay", "--config", str(bad), "--log", str(log)]) == 2
    assert "fortnight" in capsys.readouterr().err
    conf = tmp_path / "c.yaml"
    conf.write_text(CONFIG)
    assert rls_main(["replay", "--config", str(conf), "--log", str(tmp_path / "none")]) == 2
    assert "No such file" in capsys.readouterr().err
