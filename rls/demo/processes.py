"""What a running demo owns: its child processes (rls, Envoy) with their logs, the backend
servers, and its ports — one `Demo` that stops all of it in the right order.
"""

from __future__ import annotations

import subprocess
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


def spawn(name: str, cmd: list[str], workdir: Path, env: dict[str, str] | None = None) -> Child:
    """Start `cmd` with stdout and stderr in `workdir`/`name`.log."""
    log_path = workdir / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
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
