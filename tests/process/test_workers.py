"""`rls serve --workers N` leaves no orphans (issue 14 item 5): SIGKILL of the supervisor takes
its workers down and frees the ports; a worker told by the pipe alone (no parent-death signal)
still goes; a worker that hangs while draining is killed after the drain budget and the
supervisor exits 1 instead of raising.

A worker that keeps failing (issue 24 item 4) is restarted with exponential back-off, shown by
/healthcheck (503) and /metrics, and ends the supervisor (exit 1) after --worker-max-failures
consecutive failures instead of spinning."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from config.test_config_dir import good
from conftest import ROOT, free_port, http_get, wait_until
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.metrics import metric

from rls.process.workers import (
    BACKOFF_CAP,
    BACKOFF_FIRST,
    CRASH_LOOP_FAILURES,
    STATUS_FILE,
    backoff,
    worker_problem,
)
from rls.settings.environment import SHARED_DIR_ENV


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out += [int(x) for x in text]
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"  # zombies have exited
    except FileNotFoundError:
        return False


def port_free(port: int) -> bool:
    """Nobody listens there (SO_REUSEADDR: connections in TIME_WAIT do not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLS_")}
    env.update(extra)
    return env


@dataclass
class Supervisor:
    """`rls serve --workers 2` on `config`, its output in `log_path`."""

    proc: subprocess.Popen[bytes]
    config: Path
    grpc_port: int
    url: str
    log_path: Path

    def output(self) -> str:
        """The last lines of the supervisor's and workers' log (for wait_until messages)."""
        return self.log_path.read_text(errors="replace")[-6000:]

    def summed(self, name: str) -> float:
        """`name` of worker 0 plus worker 1 on /metrics."""
        return metric(self.url, name, worker="0") + metric(self.url, name, worker="1")


@contextmanager
def two_workers(tmp_path: Path, redis_url: str, *args: str) -> Iterator[Supervisor]:
    """A supervisor of two workers on a good config; SIGTERMed (killed after 30 s) at the end."""
    config = tmp_path / "a.yaml"
    config.write_text(good("alpha"))
    grpc_port, http_port = free_port(), free_port()
    log_path = tmp_path / "rls.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rls", "serve", "--config", str(config), "--workers", "2",
             "--redis-url", redis_url, "--grpc-addr", f"127.0.0.1:{grpc_port}",
             "--http-addr", f"127.0.0.1:{http_port}", *args],
            stdout=log, stderr=subprocess.STDOUT, env=clean_env(), cwd=str(ROOT),
        )
    try:
        yield Supervisor(proc, config, grpc_port, f"http://127.0.0.1:{http_port}", log_path)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_sigkill_of_the_supervisor_takes_the_workers_down(tmp_path: Path, redis_url: str):
    config = tmp_path / "a.yaml"
    config.write_text(good("alpha"))
    grpc_port, http_port = free_port(), free_port()
    log = open(tmp_path / "rls.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rls", "serve", "--config", str(config), "--workers", "2",
         "--redis-url", redis_url, "--grpc-addr", f"127.0.0.1:{grpc_port}",
         "--http-addr", f"127.0.0.1:{http_port}"],
        stdout=log, stderr=subprocess.STDOUT, env=clean_env(), cwd=str(ROOT),
    )
    try:
        wait_until(lambda: http_get(f"http://127.0.0.1:{http_port}/healthcheck")[0] == 200,
                   30, "workers serving")
        wait_until(lambda: len(children(proc.pid)) == 2, 30, "two workers")
        workers = children(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        wait_until(lambda: not any(alive(pid) for pid in workers), 30,
                   "workers gone after the supervisor's SIGKILL")
        assert port_free(grpc_port) and port_free(http_port)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in children(proc.pid) if proc.poll() is None else []:
            os.kill(pid, signal.SIGKILL)
        log.close()


def test_pipe_watch_alone_stops_an_orphaned_worker(tmp_path: Path) -> None:
    """Without the parent-death signal (non-Linux, or a re-parented worker): EOF on the
    supervisor's pipe makes the worker SIGTERM itself (its handler drains and exits)."""
    read_end, write_end = os.pipe()
    code = (
        "import signal, sys, time\n"
        "from rls.process.workers import watch_supervisor\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))\n"
        "watch_supervisor()\n"
        "print('watching', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], pass_fds=(read_end,), stdout=subprocess.PIPE,
        env=clean_env(RLS_SUPERVISOR_FD=str(read_end)), cwd=str(ROOT),
    )
    os.close(read_end)
    try:
        assert child.stdout.readline() == b"watching\n"
        time.sleep(0.2)
        assert child.poll() is None  # the pipe is open: nothing happens
        os.close(write_end)  # what the supervisor's death does
        assert child.wait(10) == 7
    finally:
        if child.poll() is None:
            child.kill()


def test_orphan_that_hangs_while_draining_exits_after_the_budget(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    code = (
        "import signal, time\n"
        "from rls.process.workers import watch_supervisor\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"  # a drain that never ends
        "watch_supervisor()\n"
        "print('watching', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], pass_fds=(read_end,), stdout=subprocess.PIPE,
        env=clean_env(RLS_SUPERVISOR_FD=str(read_end), RLS_DRAIN_BUDGET="0.5"),
        cwd=str(ROOT),
    )
    os.close(read_end)
    try:
        assert child.stdout.readline() == b"watching\n"
        os.close(write_end)
        assert child.wait(15) == 1
    finally:
        if child.poll() is None:
            child.kill()


def test_worker_hanging_while_draining_is_killed_after_the_budget(tmp_path: Path) -> None:
    """The supervisor forwards SIGTERM; a worker that ignores it is killed once the drain
    budget is spent, and the supervisor exits 1 (it used to raise TimeoutExpired)."""
    marker = tmp_path / "worker.pid"
    worker = (
        "import os, signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"open({str(marker)!r}, 'w').write(str(os.getpid()))\n"
        "time.sleep(120)\n"
    )
    supervisor = (
        "import sys\n"
        "from rls.process.workers import supervise\n"
        f"cmd = [sys.executable, '-c', {worker!r}]\n"
        "sys.exit(supervise([], 1, drain_budget=1.0, command=cmd))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", supervisor], env=clean_env(),
                            cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: marker.exists() and marker.read_text() != "", 30, "worker started")
        pid = int(marker.read_text())
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 1, out
        assert b"Traceback" not in out, out
        assert not alive(pid)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_restart_back_off_doubles_from_0_2_s_up_to_the_cap() -> None:
    waits = [backoff(n) for n in range(1, 12)]
    assert waits[:5] == [BACKOFF_FIRST * 2 ** k for k in range(5)]
    assert waits[-1] == BACKOFF_CAP == 30.0 and max(waits) == BACKOFF_CAP
    assert backoff(10_000) == BACKOFF_CAP


def test_a_worker_that_keeps_failing_is_restarted_with_back_off_then_the_supervisor_exits_1(
        tmp_path: Path) -> None:
    """A worker exiting at start (a bad config added later, say) used to be restarted every
    0.2 s forever; now each restart waits twice as long and the 5th failure in a row ends the
    supervisor with exit 1 and one clear line."""
    marker = tmp_path / "starts"
    worker = (
        "import sys, time\n"
        f"open({str(marker)!r}, 'a').write(f'{{time.monotonic()}}\\n')\n"
        "sys.exit(3)\n"
    )
    supervisor = (
        "import logging, sys\n"
        "from rls.process.workers import supervise\n"
        "logging.basicConfig(level=logging.INFO)\n"
        f"cmd = [sys.executable, '-c', {worker!r}]\n"
        "sys.exit(supervise([], 2, drain_budget=5.0, command=cmd, max_failures=5))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", supervisor], env=clean_env(),
                            cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out
    assert b"Traceback" not in out, out
    assert b"failed 5 times in a row" in out, out
    assert b"restarting in 1.6 s" in out, out
    starts = sorted(float(x) for x in marker.read_text().split())
    # Two slots, each started once and restarted after 0.2, 0.4, 0.8, 1.6 s (one may be
    # stopped early when the other gives up): at most 10 starts, never a tight loop.
    assert 8 <= len(starts) <= 10, starts
    assert starts[-1] - starts[0] >= BACKOFF_FIRST * (1 + 2 + 4 + 8) - 0.1


def _grpc_health(addr: str) -> int:
    with grpc.insecure_channel(addr) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return int(stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status)


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _workers_status(http_url: str) -> tuple[int, str]:
    status, body = http_get(http_url + "/healthcheck")
    return status, body.decode(errors="replace")


def test_a_crash_looping_worker_turns_health_503_and_shows_in_metrics(tmp_path: Path,
                                                                     redis_url: str) -> None:
    """One worker of two keeps failing (its config went bad after start): the other answers
    /healthcheck 503 naming it, gRPC health NOT_SERVING, and /metrics counts its restarts;
    once the config is good again the slot comes back, serves 10 s, and health is 200 (and
    SERVING) again."""
    with two_workers(tmp_path, redis_url, "--worker-max-failures", "50") as sup:
        proc, url, output = sup.proc, sup.url, sup.output
        wait_until(lambda: http_get(url + "/healthcheck")[0] == 200, 30, "workers serving")
        wait_until(lambda: len(children(proc.pid)) == 2, 30, "two workers")
        # Both serving before the config goes bad (the first 200 may come from one of them
        # while the other is still starting: it would read the bad config and fail too).
        wait_until(lambda: output().count("rls serving gRPC") >= 2, 30, "both workers serving",
                   output)
        sup.config.write_text("domain: alpha\ndescriptors: [\n")  # the survivor keeps its config
        os.kill(children(proc.pid)[0], signal.SIGKILL)
        wait_until(lambda: _workers_status(url)[0] == 503, 30, "health 503", output)
        wait_until(lambda: sup.summed("rls_worker_consecutive_failures") >= 2, 60,
                   "a slot failing twice in a row", output)
        status, body = _workers_status(url)
        assert status == 503 and "1 of 2 workers failing" in body, body
        grpc_addr = f"127.0.0.1:{sup.grpc_port}"
        wait_until(lambda: _grpc_health(grpc_addr) == NOT_SERVING, 10, "gRPC NOT_SERVING",
                   output)
        assert sup.summed("rls_worker_restarts_total") >= 1
        assert sup.summed("rls_worker_up") >= 1
        sup.config.write_text(good("alpha"))
        wait_until(lambda: _workers_status(url)[0] == 200, 90,
                   "health back to 200 once the slot stayed up", output)
        wait_until(lambda: _grpc_health(grpc_addr) == SERVING, 10, "gRPC SERVING", output)
        assert len(children(proc.pid)) == 2
        assert proc.poll() is None


def _slot(index: int, pid: int | None, serving: bool, failures: int) -> dict[str, object]:
    return {"index": index, "pid": pid, "serving": serving, "failures": failures,
            "restarts": failures, "last_exit": -9 if failures else None, "restart_in": 0.2}


def test_health_fails_while_a_slot_does_not_serve_or_crash_loops_not_after_one_crash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33: the rule of worker_problem, on the supervisor's status file."""
    monkeypatch.setenv(SHARED_DIR_ENV, str(tmp_path))

    def problem(*slots: dict[str, object]) -> str | None:
        (tmp_path / STATUS_FILE).write_text(json.dumps({"workers": len(slots),
                                                        "slots": list(slots)}))
        return worker_problem()

    fine = _slot(0, 100, True, 0)
    assert problem(fine, _slot(1, 101, True, 0)) is None
    assert problem(fine, _slot(1, 102, True, 1)) is None  # one crash, replaced and serving
    down = problem(fine, _slot(1, None, False, 1))
    assert down is not None and "worker 1 down" in down
    starting = problem(fine, _slot(1, 103, False, 1))
    assert starting is not None and "worker 1 starting" in starting
    looping = problem(fine, _slot(1, 104, True, CRASH_LOOP_FAILURES))
    assert looping is not None and "worker 1 crash-looping" in looping
    assert looping.startswith("1 of 2 workers failing")


def test_one_killed_worker_whose_replacement_serves_leaves_health_200(
        tmp_path: Path, redis_url: str) -> None:
    """Issue 33: with --workers 2, a worker SIGKILLed once is replaced within a second; health
    is 200 again as soon as the replacement serves, while the slot still counts its failure
    (before: 503 until the slot had served 10 s and its failure was cleared)."""
    with two_workers(tmp_path, redis_url) as sup:
        proc, url, output = sup.proc, sup.url, sup.output

        def failures() -> float:
            return sup.summed("rls_worker_consecutive_failures")

        wait_until(lambda: http_get(url + "/healthcheck")[0] == 200, 30, "workers serving",
                   output)
        victim = children(proc.pid)[0]
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: failures() == 1, 30, "the supervisor counting the crash", output)
        # Health back while the failure still counts: not held for the 10 s of stability.
        wait_until(lambda: _workers_status(url)[0] == 200 and failures() == 1, 30,
                   "health 200 with the replacement serving", output)
        assert victim not in children(proc.pid) and len(children(proc.pid)) == 2
        assert proc.poll() is None


def test_admin_md_states_the_same_worker_health_rule_as_reliability_md() -> None:
    """docs/admin.md's /healthcheck section and docs/reliability.md give one rule (issue 33):
    503 while a slot has no serving worker or crash-loops, not for 10 s after one crash."""
    admin = " ".join((ROOT / "docs" / "admin.md").read_text().split())
    section = admin[admin.index("## GET /healthcheck"):]
    section = section[:section.index("## ", 3)]
    workers = section[section.index("--workers N"):]
    assert "since it last served" not in workers, workers
    assert "no serving worker" in workers, workers
    assert f"{CRASH_LOOP_FAILURES} or more failures in a row" in workers, workers
    assert "one crash whose replacement serves" in workers, workers
    reliability = " ".join((ROOT / "docs" / "reliability.md").read_text().split())
    assert f"crash-looping ({CRASH_LOOP_FAILURES} or more failures in a row" in reliability
