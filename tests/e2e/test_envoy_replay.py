"""Live traffic through a real Envoy (envoy/gateway.yaml) and rls, then `rls replay` of the
logs it left: replay's decisions equal the live ones, request by request.

Envoy writes a JSON access log with the format of docs/changing-limits.md (START_TIME and
rls's `--dynamic-metadata`, i.e. the descriptors Envoy's own rate_limits actions produced);
rls writes its `--decision-log`. Both are replayed with the same descriptors config. Limits
are per hour (fixed windows): `same_hour_window` keeps the test inside one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rls.cli.main import parser
from rls.cli.replay import outcome

from .harness import Gateway, load_gateway, wait_for
from .test_envoy_ratelimit import DESCRIPTORS

pytestmark = pytest.mark.envoy

ACCESS_LOG_FORMAT = {
    "start_time": "%START_TIME%",
    "response_code": "%RESPONSE_CODE%",
    "ratelimit": "%DYNAMIC_METADATA(envoy.filters.http.ratelimit)%",
}


def gateway_with_access_log(tmp_path: Path, access_log: Path) -> Path:
    """envoy/gateway.yaml with the replay access log added beside its stdout one."""
    config = load_gateway()
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    manager["typed_config"]["access_log"].append({
        "name": "envoy.access_loggers.file",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3."
                     "FileAccessLog",
            "path": str(access_log),
            "log_format": {"json_format": ACCESS_LOG_FORMAT},
        },
    })
    path = tmp_path / "gateway-replay.yaml"
    path.write_text(json.dumps(config))
    return path


def replay(tmp_path: Path, log: Path) -> dict:
    conf = tmp_path / "replay-config.yaml"
    conf.write_text(DESCRIPTORS)
    _, report, error = outcome(parser().parse_args(
        ["replay", "--config", str(conf), "--log", str(log), "--json"]))
    assert report is not None, error
    return report


def test_replaying_envoys_access_log_gives_the_live_decisions(
    gateway_factory, same_hour_window, tmp_path: Path
) -> None:
    access_log = tmp_path / "access.jsonl"
    decisions = tmp_path / "decisions.jsonl"
    gw: Gateway = gateway_factory(
        DESCRIPTORS, config_file=gateway_with_access_log(tmp_path, access_log),
        rls_args=("--dynamic-metadata", "--decision-log", str(decisions)),
    )
    statuses = []
    calls = [("/items?page=1", "alice")] * 5 + [("/items?page=2", "alice")] * 4 + [
        ("/items?page=1", "bob")] * 2 + [("/other", "alice")] * 4
    for path, user in calls:
        statuses.append(gw.call(path, user).status)
    for size in (400, 400, 400):  # translate: weighted by body bytes, 1000 an hour
        statuses.append(gw.call("/translate", "bob", "POST", b"x" * size).status)
    limited = statuses.count(429)
    # 3 an hour per user and path: 2 + 1 + 1 over; translate's third 400 bytes: 1200 > 1000.
    assert limited == 5 and statuses.count(200) + limited == len(statuses), statuses

    # The warm-up call and ours; Envoy flushes its file log about once a second.
    wait_for(lambda: access_log.exists()
             and len(access_log.read_text().splitlines()) >= len(calls) + 4,
             10.0, "Envoy's access log lines", log=gw.logs)
    report = replay(tmp_path, access_log)
    assert report["bad_lines"]["total"] == 0, report["bad_lines"]
    assert report["over_limit"] == limited, (report, statuses)
    answers = report["logged_answers"]
    assert answers["different"] == 0 and answers["lines"] == report["requests"], answers
    codes = [json.loads(x)["response_code"] for x in access_log.read_text().splitlines()]
    assert codes.count(429) == limited
    by_limit = {r["limit"]: r["over_limit"] for r in report["limits"]}
    assert by_limit == {"gateway.user.path": 4, "gateway.api_translate.user": 1}

    gw.rls.stop()  # writes what its decision log still queues
    from_rls = replay(tmp_path, decisions)
    assert from_rls["logged_answers"]["different"] == 0
    assert (from_rls["requests"], from_rls["over_limit"]) == (report["requests"], limited)

    def who(r: dict) -> list[tuple[str, str, int]]:  # times differ: Envoy's start, rls's now
        return sorted((x["descriptor"], x["limit"], x["over_limit"]) for x in r["limited"])

    assert who(from_rls) == who(report)


def test_the_documented_access_log_is_the_one_tested_here() -> None:
    import re

    import yaml

    doc = (Path(__file__).resolve().parents[2] / "docs" / "changing-limits.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", doc, re.S)
                 if "envoy.access_loggers.file" in b)
    logger = yaml.safe_load(block)["access_log"][0]
    assert logger["typed_config"]["log_format"]["json_format"] == ACCESS_LOG_FORMAT
