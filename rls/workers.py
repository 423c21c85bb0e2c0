"""`rls serve --workers N`: a supervisor running N single-process workers on shared ports.

Each worker is a full `rls serve` process. The gRPC and admin ports are shared with
SO_REUSEPORT, so the kernel spreads connections. Workers share:
- metrics, through prometheus_client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR): any
  worker's /metrics shows the sum over all of them;
- runtime switches, through a small JSON file in the same directory that every worker checks;
- counters, through Redis — so several workers need `--redis-url` (the memory backend is per
  process and would multiply every limit by N).
The supervisor restarts a worker that dies, forwards SIGTERM/SIGINT, and exits 0 after all
workers drained; a worker still running after the drain budget is killed (exit 1).

Workers die with their supervisor, even when it is SIGKILLed (no orphans holding the ports):
on Linux each worker asks the kernel for SIGTERM when its parent dies (prctl
PR_SET_PDEATHSIG), and on any system it watches a pipe whose write end only the supervisor
holds: end of file means the supervisor is gone, so the worker drains as on SIGTERM and is
killed by itself if draining overruns its budget.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

log = logging.getLogger("rls.workers")

WORKER_ENV = "RLS_WORKER_INDEX"
SHARED_DIR_ENV = "RLS_SHARED_DIR"
SUPERVISOR_FD_ENV = "RLS_SUPERVISOR_FD"  # read end of the pipe that tells a worker its parent died
DRAIN_BUDGET_ENV = "RLS_DRAIN_BUDGET"  # seconds a worker may take to drain once orphaned
PR_SET_PDEATHSIG = 1
# A worker's shutdown: shutdown delay (1 s) + drain (5 s) by default, plus start-up slack.
DEFAULT_DRAIN_BUDGET = 11.0


def _die_with_parent(parent: int) -> None:
    """In the forked worker, before exec: SIGTERM when the supervisor dies (Linux only)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the pipe watch covers it
        pass
    if os.getppid() != parent:  # the supervisor died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def supervise(
    argv: Sequence[str],
    workers: int,
    drain_budget: float = DEFAULT_DRAIN_BUDGET,
    command: Sequence[str] | None = None,
) -> int:
    """Run `workers` workers until SIGTERM/SIGINT; `command` replaces the worker command line
    (tests)."""
    shared = tempfile.mkdtemp(prefix="rls-workers-")
    env = dict(os.environ)
    env["PROMETHEUS_MULTIPROC_DIR"] = shared
    env[SHARED_DIR_ENV] = shared
    env[DRAIN_BUDGET_ENV] = str(drain_budget)
    cmd = list(command) if command else [sys.executable, "-m", "rls", *argv, "--workers", "1"]
    procs: dict[int, subprocess.Popen[bytes]] = {}
    stopping = False
    # Never written, never closed by the supervisor: its death closes it (EOF for the workers).
    watch_read, watch_write = os.pipe()
    os.set_inheritable(watch_read, True)
    me = os.getpid()

    def start(index: int) -> None:
        procs[index] = subprocess.Popen(
            cmd,
            env={**env, WORKER_ENV: str(index), SUPERVISOR_FD_ENV: str(watch_read)},
            pass_fds=(watch_read,),
            preexec_fn=lambda: _die_with_parent(me),  # the supervisor has no threads
        )
        log.info("worker %d started (pid %d)", index, procs[index].pid)

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for index in range(workers):
        start(index)
    try:
        while True:
            time.sleep(0.2)
            if stopping:
                break
            for index, proc in list(procs.items()):
                code = proc.poll()
                if code is not None and not stopping:
                    log.error("worker %d exited with %d; restarting", index, code)
                    _mark_dead(proc.pid)
                    start(index)
        deadline = time.monotonic() + drain_budget
        codes = []
        for index, proc in procs.items():
            try:
                codes.append(proc.wait(timeout=max(deadline - time.monotonic(), 0.0)))
            except subprocess.TimeoutExpired:
                log.error(
                    "worker %d (pid %d) still draining after %g s; killed",
                    index,
                    proc.pid,
                    drain_budget,
                )
                proc.kill()
                codes.append(proc.wait())
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        os.close(watch_read)
        os.close(watch_write)
        shutil.rmtree(shared, ignore_errors=True)
    return 0 if all(code == 0 for code in codes) else 1


def watch_supervisor() -> threading.Thread | None:
    """In a worker: drain (SIGTERM to ourselves) when the supervisor's pipe reports its death,
    and exit by force if draining overruns the budget. No-op outside `--workers`."""
    raw = os.environ.get(SUPERVISOR_FD_ENV)
    if not raw:
        return None
    fd = int(raw)
    budget = float(os.environ.get(DRAIN_BUDGET_ENV, DEFAULT_DRAIN_BUDGET))

    def watch() -> None:
        try:
            while os.read(fd, 1):  # nobody writes: returns b"" once the supervisor is gone
                pass
        except OSError:
            pass
        log.error("supervisor gone; draining and exiting")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(budget)
        log.error("still draining after %g s; exiting", budget)
        os._exit(1)

    thread = threading.Thread(target=watch, name="rls-supervisor-watch", daemon=True)
    thread.start()
    return thread


def _mark_dead(pid: int) -> None:
    from prometheus_client import multiprocess

    try:
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
    except Exception:
        pass


def shared_dir() -> str | None:
    return os.environ.get(SHARED_DIR_ENV)
