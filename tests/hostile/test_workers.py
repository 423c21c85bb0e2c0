"""`rls serve --workers N` leaves no orphans (issue 14 item 5): SIGKILL of the supervisor takes
its workers down and frees the ports; a worker told by the pipe alone (no parent-death signal)
still goes; a worker that hangs while draining is killed after the drain budget and the
supervisor exits 1 instead of raising."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT, free_port, http_get, wait_until

from .test_config_dir import good


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
        "from rls.workers import watch_supervisor\n"
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
        "from rls.workers import watch_supervisor\n"
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
        "from rls.workers import supervise\n"
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
