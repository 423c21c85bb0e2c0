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

A worker that keeps dying is not restarted in a tight loop: its slot waits BACKOFF_FIRST (0.2 s)
before the first restart, doubling after each further consecutive failure up to BACKOFF_CAP
(30 s); a worker that serves (listens on its ports) for STABLE_SECONDS (10 s) clears its slot's
failures (time spent starting does not count: on a loaded host a start that fails can take
longer than that). While a slot has no serving worker (down, or its process not listening
yet), or has failed CRASH_LOOP_FAILURES (2) times or more since it was last stable (a crash
loop), every worker's /healthcheck answers 503 naming it (the supervisor writes the slots to
`$RLS_SHARED_DIR/workers.json`; workers read it). One crash whose replacement serves is not a
reason to take the pod out of service; the slot's failure count still shows in /metrics, and
/metrics shows rls_worker_up, rls_worker_consecutive_failures and rls_worker_restarts_total by
worker. After `--worker-max-failures` consecutive failures of one slot (default 10: ~2 minutes
of back-off) the supervisor stops the other workers and exits 1 instead of spinning, so the pod
or unit restarts and reports a crash loop.

Workers die with their supervisor, even when it is SIGKILLed (no orphans holding the ports):
on Linux each worker asks the kernel for SIGTERM when its parent dies (prctl
PR_SET_PDEATHSIG), and on any system it watches a pipe whose write end only the supervisor
holds: end of file means the supervisor is gone, so the worker drains as on SIGTERM and is
killed by itself if draining overruns its budget.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from rls.settings.environment import (
    DRAIN_BUDGET_ENV,
    MULTIPROC_DIR_ENV,
    SHARED_DIR_ENV,
    SUPERVISOR_FD_ENV,
    WORKER_ENV,
    process_env,
    shared_dir,
    supervisor_fd,
    worker_drain_budget,
)

log = logging.getLogger("rls.workers")

PR_SET_PDEATHSIG = 1
# A worker's shutdown: shutdown delay (1 s) + drain (5 s) by default, plus start-up slack.
DEFAULT_DRAIN_BUDGET = 11.0
BACKOFF_FIRST = 0.2  # seconds before the first restart of a slot
BACKOFF_CAP = 30.0  # the longest wait between restarts
STABLE_SECONDS = 10.0  # serving this long: the slot's consecutive failures are cleared
DEFAULT_MAX_FAILURES = 10  # consecutive failures of one slot before the supervisor gives up
CRASH_LOOP_FAILURES = 2  # failures in a row from which health says "not serving" (a crash loop)
STATUS_FILE = "workers.json"
READY_PREFIX = "ready-"  # `ready-<pid>` in the shared directory: that worker serves
TICK = 0.2  # the supervisor's polling period


@dataclass(slots=True)
class Slot:
    """One worker position: its current process (None while waiting to restart) and history."""

    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ready: float | None = None  # when the current process said it serves (mark_ready)
    failures: int = 0  # consecutive exits since it last served STABLE_SECONDS
    restarts: int = 0
    last_exit: int | None = None
    restart_at: float = 0.0

    def status(self, now: float) -> dict[str, Any]:
        return {
            "index": self.index,
            "pid": self.proc.pid if self.proc is not None else None,
            "serving": self.proc is not None and self.ready is not None,
            "failures": self.failures,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "restart_in": round(max(self.restart_at - now, 0.0), 1) if self.proc is None else 0,
        }


def backoff(failures: int) -> float:
    """Wait before restarting a slot after its `failures`-th consecutive failure."""
    return float(min(BACKOFF_FIRST * 2 ** min(failures - 1, 30), BACKOFF_CAP))


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
    max_failures: int = DEFAULT_MAX_FAILURES,
) -> int:
    """Run `workers` workers until SIGTERM/SIGINT, or until one slot failed `max_failures`
    times in a row (exit 1); `command` replaces the worker command line (tests)."""
    shared = tempfile.mkdtemp(prefix="rls-workers-")
    env = _worker_env(shared, drain_budget)
    cmd = list(command) if command else [sys.executable, "-m", "rls", *argv, "--workers", "1"]
    slots = [Slot(index) for index in range(workers)]
    stopping = False
    gave_up = False
    # Never written, never closed by the supervisor: its death closes it (EOF for the workers).
    watch_read, watch_write = os.pipe()
    os.set_inheritable(watch_read, True)
    start = _starter(cmd, env, watch_read)

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for proc in _running(slots):
            proc.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for slot in slots:
        start(slot)
    _write_status(shared, slots)
    codes: list[int] = []
    try:
        while not stopping:
            time.sleep(TICK)
            if stopping:
                break
            changed = False
            for slot in slots:
                if stopping:  # a signal arrived: start nothing more
                    break
                changed |= _tend(slot, start, shared)
                if _failed_for_good(slot, max_failures):
                    gave_up = True
                    stop(signal.SIGTERM, None)
                    break
            if changed:
                _write_status(shared, slots)
        codes = _drain(slots, drain_budget)
    finally:
        _clean_up(slots, (watch_read, watch_write), shared)
    return 0 if not gave_up and all(code == 0 for code in codes) else 1


def _starter(cmd: list[str], env: dict[str, str], watch_read: int) -> Callable[[Slot], None]:
    """What (re)starts a slot's worker: `cmd` with its slot index and the watch pipe's end."""
    me = os.getpid()

    def start(slot: Slot) -> None:
        slot.proc = subprocess.Popen(
            cmd,
            env={**env, WORKER_ENV: str(slot.index), SUPERVISOR_FD_ENV: str(watch_read)},
            pass_fds=(watch_read,),
            preexec_fn=lambda: _die_with_parent(me),  # the supervisor has no threads
        )
        slot.started = time.monotonic()
        slot.ready = None
        log.info("worker %d started (pid %d)", slot.index, slot.proc.pid)

    return start


def _worker_env(shared: str, drain_budget: float) -> dict[str, str]:
    """Every worker's environment: the supervisor's own, plus where the shared directory is
    (status, readiness, multiprocess metrics) and how long an orphan may drain."""
    env = dict(process_env())
    env[MULTIPROC_DIR_ENV] = shared
    env[SHARED_DIR_ENV] = shared
    env[DRAIN_BUDGET_ENV] = str(drain_budget)
    return env


def _failed_for_good(slot: Slot, max_failures: int) -> bool:
    """Whether the slot failed `max_failures` times in a row: the supervisor gives up (logged)."""
    if slot.failures < max_failures:
        return False
    log.error(
        "worker %d failed %d times in a row (last exit %s); stopping all "
        "workers and exiting 1 (--worker-max-failures)",
        slot.index, slot.failures, slot.last_exit,
    )
    return True


def _clean_up(slots: Sequence[Slot], pipe: tuple[int, int], shared: str) -> None:
    """Whatever happened: no worker left running, the watch pipe closed, the directory gone."""
    for proc in _running(slots):
        proc.kill()
        proc.wait()
    for fd in pipe:
        os.close(fd)
    shutil.rmtree(shared, ignore_errors=True)


def _running(slots: Sequence[Slot]) -> Iterator[subprocess.Popen[bytes]]:
    for slot in slots:
        if slot.proc is not None and slot.proc.poll() is None:
            yield slot.proc


def _tend(slot: Slot, start: Any, shared: str) -> bool:
    """One supervisor tick for one slot: notice an exit (schedule the restart with back-off),
    start it when its back-off is over, clear its failures once it served STABLE_SECONDS.
    True if the slot's reported state changed."""
    now = time.monotonic()
    proc = slot.proc
    if proc is None:
        if now < slot.restart_at:
            return False
        slot.restarts += 1
        start(slot)
        return True
    code = proc.poll()
    marker = Path(shared) / f"{READY_PREFIX}{proc.pid}"
    became_ready = slot.ready is None and marker.exists()
    if became_ready:
        slot.ready = now  # the slot serves again: health may be fine (worker_problem)
    if code is None:
        if slot.failures and slot.ready is not None and now - slot.ready >= STABLE_SECONDS:
            log.info("worker %d served %g s: failures cleared", slot.index, STABLE_SECONDS)
            slot.failures = 0
            return True
        return became_ready
    marker.unlink(missing_ok=True)
    if slot.ready is not None and now - slot.ready >= STABLE_SECONDS:
        slot.failures = 0  # it had been stable: this exit starts a new count
    slot.failures += 1
    slot.last_exit = code
    slot.proc = None
    _mark_dead(proc.pid)
    delay = backoff(slot.failures)
    slot.restart_at = now + delay
    log.error(
        "worker %d (pid %d) exited with %d after %.1f s (%d in a row); restarting in %.1f s",
        slot.index, proc.pid, code, now - slot.started, slot.failures, delay,
    )
    return True


def _drain(slots: Sequence[Slot], drain_budget: float) -> list[int]:
    """Wait for every running worker within the budget; kill the ones still draining."""
    deadline = time.monotonic() + drain_budget
    codes = []
    for slot in slots:
        proc = slot.proc
        if proc is None:
            continue
        try:
            codes.append(proc.wait(timeout=max(deadline - time.monotonic(), 0.0)))
        except subprocess.TimeoutExpired:
            log.error(
                "worker %d (pid %d) still draining after %g s; killed",
                slot.index, proc.pid, drain_budget,
            )
            proc.kill()
            codes.append(proc.wait())
    return codes


def _write_status(shared: str, slots: Sequence[Slot]) -> None:
    """The slots for the workers' /healthcheck and /metrics (replaced whole, never torn)."""
    now = time.monotonic()
    path = Path(shared) / STATUS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"workers": len(slots), "slots": [s.status(now) for s in slots]}))
    tmp.replace(path)


def mark_ready() -> None:
    """In a worker: tell the supervisor it now serves (no-op outside `--workers`)."""
    shared = shared_dir()
    if shared is not None:
        (Path(shared) / f"{READY_PREFIX}{os.getpid()}").touch()


def read_status() -> dict[str, Any] | None:
    """The supervisor's last slot report, None outside `--workers` (or not yet written)."""
    shared = shared_dir()
    if shared is None:
        return None
    try:
        status: dict[str, Any] = json.loads((Path(shared) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return status


def worker_problem() -> str | None:
    """Why this pod is not healthy because of a sibling worker (one line), or None.

    A slot is a problem while it has no serving worker (down, or its process not listening
    yet) or while it is crash-looping (CRASH_LOOP_FAILURES exits in a row without serving
    STABLE_SECONDS in between). One crash whose replacement serves is not: the pod serves."""
    status = read_status()
    if status is None:
        return None
    bad = [_slot_problem(slot) for slot in status.get("slots", [])]
    found = [text for text in bad if text is not None]
    if not found:
        return None
    return f"{len(found)} of {status['workers']} workers failing: " + "; ".join(found)


def _slot_problem(slot: dict[str, Any]) -> str | None:
    failures = f", {slot['failures']} failures in a row"
    if slot["pid"] is None:
        return (f"worker {slot['index']} down (exit {slot['last_exit']}, restart in "
                f"{slot['restart_in']} s){failures}")
    if not slot.get("serving", True):
        return f"worker {slot['index']} starting (pid {slot['pid']}, not serving yet){failures}"
    if slot["failures"] >= CRASH_LOOP_FAILURES:
        return (f"worker {slot['index']} crash-looping (pid {slot['pid']}, healthy once it "
                f"served {STABLE_SECONDS:g} s){failures}")
    return None


class WorkersCollector:
    """/metrics families of the supervisor's slots (read from its status file)."""

    def collect(self) -> Iterator[Any]:
        status = read_status()
        up = GaugeMetricFamily(
            "rls_worker_up", "1 while the worker slot has a running process", labels=["worker"]
        )
        failing = GaugeMetricFamily(
            "rls_worker_consecutive_failures",
            "Exits of the worker slot since it last served 10 s (from 2: health fails)",
            labels=["worker"],
        )
        restarts = CounterMetricFamily(
            "rls_worker_restarts", "Restarts of the worker slot by the supervisor",
            labels=["worker"],
        )
        for slot in (status or {}).get("slots", []):
            label = [str(slot["index"])]
            up.add_metric(label, 0.0 if slot["pid"] is None else 1.0)
            failing.add_metric(label, float(slot["failures"]))
            restarts.add_metric(label, float(slot["restarts"]))
        yield from (up, failing, restarts)


def watch_supervisor() -> threading.Thread | None:
    """In a worker: drain (SIGTERM to ourselves) when the supervisor's pipe reports its death,
    and exit by force if draining overruns the budget. No-op outside `--workers`."""
    fd = supervisor_fd()
    if fd is None:
        return None
    budget = worker_drain_budget(DEFAULT_DRAIN_BUDGET)

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
    try:
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
    except Exception:
        pass

