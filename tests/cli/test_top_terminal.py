"""`rls top` driven in a real terminal (tmux): it refreshes and shows the limited descriptors
of a known workload, in order."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import wait_until
from observability.helpers import DOMAIN, EXPECTED_OVER, run_workload, write_config
from support.terminal import rls_top

pytestmark = pytest.mark.slow


def test_rls_top_in_a_terminal_shows_the_limited_descriptors_in_order(rls_factory, tmp_path: Path):
    rls = rls_factory(write_config(tmp_path))
    with rls_top(rls.http_url, 160, 40, "--domain", DOMAIN) as term:
        screen = term.screen

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
        term.press("C-c")
        term.wait_closed("rls top to exit on Ctrl-C")
