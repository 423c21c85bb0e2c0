"""`rls top` driven in a real terminal (tmux): it refreshes and shows the limited descriptors
of a known workload, in order."""

from __future__ import annotations

import shlex
import subprocess
import sys
import uuid
from pathlib import Path

from conftest import ROOT, wait_until
from support.system import require_binary

from .helpers import DOMAIN, EXPECTED_OVER, run_workload, write_config


def tmux_binary() -> str:
    return require_binary("tmux", "tmux")


def test_rls_top_in_a_terminal_shows_the_limited_descriptors_in_order(rls_factory, tmp_path: Path):
    tmux = tmux_binary()
    rls = rls_factory(write_config(tmp_path))
    socket = f"rls-top-{uuid.uuid4().hex[:8]}"  # a tmux server of our own
    base = [tmux, "-L", socket]
    command = shlex.join([sys.executable, "-m", "rls", "top", "--admin", rls.http_url,
                          "--interval", "0.3", "--domain", DOMAIN])
    subprocess.run([*base, "new-session", "-d", "-s", "top", "-x", "160", "-y", "40",
                    "-c", str(ROOT), command], check=True)
    try:
        def screen() -> str:
            return subprocess.run([*base, "capture-pane", "-p", "-t", "top"], check=True,
                                  capture_output=True, text=True).stdout

        wait_until(lambda: "DESCRIPTOR" in screen(), timeout=20, what="rls top's header")
        assert "no descriptor over its limit" in screen()
        run_workload(rls.grpc_addr)  # the view refreshes by itself: no key pressed

        def rows() -> list[tuple[str, int]]:
            found = []
            for line in screen().splitlines():
                parts = line.split()
                if len(parts) == 5 and parts[0] == DOMAIN:
                    found.append((parts[4], int(parts[1])))
            return found

        try:
            wait_until(lambda: rows() == EXPECTED_OVER, timeout=20, what="the workload's rows")
        except TimeoutError:
            raise AssertionError(f"screen:\n{screen()}") from None
        text = screen()
        assert text.count("DESCRIPTOR") == 1  # cleared and redrawn, not scrolled
        subprocess.run([*base, "send-keys", "-t", "top", "C-c"], check=True)
        wait_until(
            lambda: subprocess.run([*base, "has-session", "-t", "top"],
                                   capture_output=True).returncode != 0,
            timeout=10, what="rls top to exit on Ctrl-C",
        )
    finally:
        subprocess.run([*base, "kill-server"], capture_output=True)
