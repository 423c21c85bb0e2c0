"""`rls serve --workers N`: a supervisor running N single-process workers on shared ports.

Each worker is a full `rls serve` process. The gRPC and admin ports are shared with
SO_REUSEPORT, so the kernel spreads connections. Workers share:
- metrics, through prometheus_client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR): any
  worker's /metrics shows the sum over all of them;
- runtime switches, through a small JSON file in the same directory that every worker checks;
- counters, through Redis — so several workers need `--redis-url` (the memory backend is per
  process and would multiply every limit by N).
The supervisor restarts a worker that dies, forwards SIGTERM/SIGINT, and exits 0 after all
workers drained.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

log = logging.getLogger("rls.workers")

WORKER_ENV = "RLS_WORKER_INDEX"
SHARED_DIR_ENV = "RLS_SHARED_DIR"


def supervise(argv: Sequence[str], workers: int) -> int:
    shared = tempfile.mkdtemp(prefix="rls-workers-")
    env = dict(os.environ)
    env["PROMETHEUS_MULTIPROC_DIR"] = shared
    env[SHARED_DIR_ENV] = shared
    cmd = [sys.executable, "-m", "rls", *argv, "--workers", "1"]
    procs: dict[int, subprocess.Popen[bytes]] = {}
    stopping = False

    def start(index: int) -> None:
        procs[index] = subprocess.Popen(cmd, env={**env, WORKER_ENV: str(index)})
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
        codes = [proc.wait(timeout=30) for proc in procs.values()]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
        shutil.rmtree(shared, ignore_errors=True)
    return 0 if all(code == 0 for code in codes) else 1


def _mark_dead(pid: int) -> None:
    from prometheus_client import multiprocess

    try:
        multiprocess.mark_process_dead(pid)
    except Exception:
        pass


def shared_dir() -> str | None:
    return os.environ.get(SHARED_DIR_ENV)
