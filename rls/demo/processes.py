"""What a running demo owns: its child processes (rls, Envoy) with their logs, the backend
servers, and its ports — one `Demo` that stops all of it in the right order.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path


@dataclass
class Child:
    """A child process whose output goes to `log_path` (shown when something fails)."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        tail = "\n".join(text.splitlines()[-lines:])
        return f"--- last lines of {self.log_path} ---\n{tail}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that makes the kernel send the child SIGTERM when the demo dies, however
    it dies (SIGKILL included: no handler of ours runs then); None where there is no prctl.

    Linux's PR_SET_PDEATHSIG fires when the thread that forked the child ends: children are
    spawned from the demo's main thread, which lives as long as the demo. It survives exec.
    Everything is looked up here, before the fork: between fork and exec the child only
    calls prctl and getppid (a parent that died before prctl ran would never signal it).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    getppid, kill, me = os.getppid, os.kill, os.getpid

    def in_child() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if getppid() != parent:  # the demo is already gone
            kill(me(), signal.SIGTERM)

    return in_child


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def spawn(name: str, cmd: list[str], workdir: Path, env: dict[str, str] | None = None) -> Child:
    """Start `cmd` with stdout and stderr in `workdir`/`name`.log; it ends when the demo does
    (a SIGKILLed demo must not leave rls and Envoy holding its ports)."""
    log_path = workdir / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=_die_with_parent())
    return Child(name, proc, log_path)


@dataclass
class Demo:
    listener: int
    envoy_admin: int
    grpc: int
    http: int
    backends: list[int]
    keys: dict[str, str]
    workdir: Path
    children: list[Child] = field(default_factory=list)
    servers: list[ThreadingHTTPServer] = field(default_factory=list)
    cache: bool = False  # --cache: Envoy's ext_proc response cache served by rls
    extproc: int = 0  # rls's ext_proc listener port (--cache)

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.http}"

    def key(self, client: str) -> str:
        return self.keys.get(client) or next(iter(self.keys.values()), "")

    def stop(self) -> None:
        for child in reversed(self.children):  # Envoy first, then rls
            child.stop()
        for server in self.servers:
            server.shutdown()
            server.server_close()
