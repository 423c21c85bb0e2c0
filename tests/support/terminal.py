"""`rls top` in a real terminal: a tmux server of the test's own, read back by capture-pane.

One place for the session plumbing the `rls top` tests share (start, screen, keys, exit,
teardown), so each test reads as what it checks on the screen.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .system import require_binary
from .waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Terminal:
    """The tmux session "top" on the tmux server `base` talks to."""

    base: list[str]

    def screen(self) -> str:
        """What the terminal shows now."""
        return subprocess.run([*self.base, "capture-pane", "-p", "-t", "top"], check=True,
                              capture_output=True, text=True).stdout

    def press(self, key: str) -> None:
        subprocess.run([*self.base, "send-keys", "-t", "top", key], check=True)

    def wait_closed(self, what: str) -> None:
        """Wait (10 s at most) until the program in the session has exited."""
        wait_until(
            lambda: subprocess.run([*self.base, "has-session", "-t", "top"],
                                   capture_output=True).returncode != 0,
            timeout=10, what=what,
        )


@contextmanager
def rls_top(admin_url: str, columns: int, lines: int, *args: str) -> Iterator[Terminal]:
    """`rls top --interval 0.3 --admin admin_url *args` in a `columns` x `lines` terminal;
    the tmux server is killed at the end whatever happened."""
    tmux = require_binary("tmux", "tmux")
    base = [tmux, "-L", f"rls-top-{uuid.uuid4().hex[:8]}"]  # a tmux server of our own
    command = shlex.join([sys.executable, "-m", "rls", "top", "--interval", "0.3",
                          "--admin", admin_url, *args])
    subprocess.run([*base, "new-session", "-d", "-s", "top", "-x", str(columns),
                    "-y", str(lines), "-c", str(ROOT), command], check=True)
    try:
        yield Terminal(base)
    finally:
        subprocess.run([*base, "kill-server"], capture_output=True)
