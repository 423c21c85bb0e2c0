"""Logs (README settings `--log-format`, "Operating it" / Logs): JSON lines, invalid requests
logged at most 5 lines a second with the call's x-request-id."""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
from support.calls import OK, Grpc, delta, descriptor, request, scrape

CONFIG = """
domain: logs
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 5}
"""

FLOOD = 500


def invalid(client: Grpc, request_id: str | None = None) -> grpc.StatusCode:
    metadata = [("x-request-id", request_id)] if request_id else None
    try:
        client.stub.ShouldRateLimit(request("", descriptor(("k", "v"))), timeout=10,
                                    metadata=metadata)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def lines_mentioning(log: str, text: str) -> list[dict]:
    return [json.loads(line) for line in log.splitlines() if text in line]


def test_json_logs_rate_limited_invalid_requests_and_request_id(spawner, tmp_path: Path):
    config = tmp_path / "logs.yaml"
    config.write_text(CONFIG)
    srv = spawner(config, args=("--log-format", "json"))
    with Grpc(srv.grpc_addr) as client:
        assert client.one("logs", ("k", "v")).overall_code == OK
        assert invalid(client, "abc123") == grpc.StatusCode.INVALID_ARGUMENT
        # The next line may be suppressed by the limit of this second: wait for a new second.
        time.sleep(1.1)
        before = scrape(srv.http_url)
        started = time.monotonic()
        bad = request("", descriptor(("k", "v")))
        futures = [client.stub.ShouldRateLimit.future(bad, timeout=30) for _ in range(FLOOD)]
        codes = [f.exception().code() if f.exception() else grpc.StatusCode.OK
                 for f in futures]
        elapsed = time.monotonic() - started
    assert set(codes) == {grpc.StatusCode.INVALID_ARGUMENT}
    after = scrape(srv.http_url)
    assert delta(before, after, "rls_request_errors_total", reason="invalid_argument") == FLOOD

    log = srv.log()
    lines = [line for line in log.splitlines() if line.strip()]
    assert lines, "no log output"
    not_json = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            not_json.append(line)
            continue
        if not (
            isinstance(record, dict)
            and all(isinstance(record.get(k), str) for k in ("level", "logger", "msg"))
        ):
            not_json.append(line)
    assert not not_json, f"--log-format json printed other lines: {not_json[:5]}"
    levels = {json.loads(line)["level"] for line in lines}
    assert levels <= {"debug", "info", "warning", "error", "critical"}, levels

    tagged = lines_mentioning(log, "abc123")
    assert tagged, "the invalid request's x-request-id is not in the log"
    assert "invalid request" in tagged[0]["msg"]

    flood = lines_mentioning(log, "invalid request")
    flood = [r for r in flood if "abc123" not in r["msg"]]
    # At most 5 lines in each second the flood touched (plus the second it ended in).
    allowed = 5 * (int(elapsed) + 2)
    assert len(flood) in range(1, allowed + 1), (
        f"{FLOOD} invalid requests in {elapsed:.2f} s gave {len(flood)} log lines "
        f"(at most {allowed} expected)"
    )
