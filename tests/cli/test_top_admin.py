"""Admin GET /top and `rls top --once` against a real `rls serve` with a known workload."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, start_redis, wait_until
from observability.helpers import (
    DOMAIN,
    EXPECTED_OVER,
    get_json,
    over_rows,
    run_workload,
    worker_files,
    write_config,
)

from rls.engine.top import merge_top

pytestmark = pytest.mark.slow

TOKEN = "t0p-secret"


def test_top_lists_over_limit_descriptors_in_order_behind_the_token(rls_factory, tmp_path: Path):
    rls = rls_factory(write_config(tmp_path), env={"RLS_ADMIN_TOKEN": TOKEN})
    run_workload(rls.grpc_addr)

    status, payload = get_json(rls.http_url + "/top")
    assert status == 401, payload
    status, payload = get_json(rls.http_url + "/top", token="wrong")
    assert status == 401, payload

    status, payload = get_json(rls.http_url + "/top?window=1m&sort=over", token=TOKEN)
    assert status == 200, payload
    assert payload["window"] == "1m" and payload["sort"] == "over"
    assert over_rows(payload) == EXPECTED_OVER  # dave never went over; team never limited
    assert all(row["error"] == 0 for row in payload["domains"][DOMAIN])

    # Near: each user crossed 80 % once (the call that used the last hit); dave only that.
    status, payload = get_json(rls.http_url + "/top?sort=near&window=5m", token=TOKEN)
    assert status == 200, payload
    near = {row["descriptor"]: row["near"] for row in payload["domains"][DOMAIN]}
    assert near == {"user=alice": 1, "user=bob": 1, "user=carol": 1, "user=dave": 1}

    status, payload = get_json(rls.http_url + "/top?limit=2&domain=" + DOMAIN, token=TOKEN)
    assert over_rows(payload) == EXPECTED_OVER[:2]
    status, payload = get_json(rls.http_url + "/top?domain=nope", token=TOKEN)
    assert status == 200 and payload["domains"] == {}

    for bad in ("window=2m", "sort=up", "limit=0", "limit=x"):
        status, payload = get_json(rls.http_url + "/top?" + bad, token=TOKEN)
        assert status == 400 and "error" in payload, (bad, payload)


def test_top_once_prints_the_limited_descriptors_in_order(rls_factory, tmp_path: Path):
    rls = rls_factory(write_config(tmp_path), env={"RLS_ADMIN_TOKEN": TOKEN})
    run_workload(rls.grpc_addr)
    cmd = [sys.executable, "-m", "rls", "top", "--once", "--admin", rls.http_url]
    denied = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=ROOT,
                            env={"PATH": "/usr/bin:/bin"})
    assert denied.returncode == 1 and "401" in denied.stderr, denied
    done = subprocess.run([*cmd, "--token", TOKEN], capture_output=True, text=True, timeout=30,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].split()[:4] == ["DOMAIN", "OVER", "NEAR", "±ERR"]
    rows = [line.split() for line in lines[2:]]
    assert [(r[4], int(r[1])) for r in rows] == EXPECTED_OVER
    assert all(r[0] == DOMAIN for r in rows)
    assert "\x1b[2J" not in done.stdout  # --once never clears the screen


def test_top_sums_over_workers_with_redis(rls_factory, tmp_path: Path):
    redis = start_redis()
    try:
        rls = rls_factory(write_config(tmp_path),
                          args=("--workers", "2", "--redis-url", redis.url))
        # Both workers listening before the workload: SO_REUSEPORT can only spread
        # connections over the workers already bound to the port.
        wait_until(lambda: rls.log().count("rls serving gRPC") >= 2, timeout=30,
                   what="both workers serving")
        run_workload(rls.grpc_addr, fresh_channels=True)
        seen: dict[str, object] = {}

        def summed() -> bool:
            status, payload = get_json(rls.http_url + "/top")
            seen.update(payload)
            return (status == 200 and payload["workers"] == 2
                    and over_rows(payload) == EXPECTED_OVER)

        try:
            wait_until(summed, timeout=10, what="/top summed over both workers")
        except TimeoutError:
            raise AssertionError(f"last /top answer: {seen}") from None
        # Each worker saw only part of the over-limit calls: the totals above are sums. (A
        # worker writes its file a second after it starts and every second after.)
        parts: list[int] = []

        def each_worker_saw_a_part() -> bool:
            parts[:] = []
            for path in worker_files(rls.proc.pid):
                top = merge_top([json.loads(path.read_text())], window="5m")
                parts.append(sum(r["over"] for r in top.get(DOMAIN, [])))
            return len(parts) == 2 and sum(parts) == 38

        try:
            wait_until(each_worker_saw_a_part, timeout=10, what="both workers' files")
        except TimeoutError:
            raise AssertionError(f"over-limit calls per worker file: {parts}") from None
        assert all(part > 0 for part in parts), parts
    finally:
        redis.stop()


def test_other_workers_skips_own_stale_and_half_written_files(tmp_path: Path):
    import os
    import time

    from rls.admin.top import STALE_SECONDS, other_workers

    snap = {"now": 1, "domains": {}}
    (tmp_path / "top-1.json").write_text(json.dumps(snap))  # a live worker
    (tmp_path / f"top-{os.getpid()}.json").write_text(json.dumps(snap))  # this process
    dead = tmp_path / "top-2.json"  # a worker that died: its file stopped changing
    dead.write_text(json.dumps(snap))
    old = time.time() - STALE_SECONDS - 1
    os.utime(dead, (old, old))
    (tmp_path / "top-3.json").write_text('{"now": ')  # not valid JSON
    (tmp_path / "top-4.tmp").write_text(json.dumps(snap))  # being written
    assert other_workers(str(tmp_path)) == [snap]
