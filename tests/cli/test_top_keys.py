"""Issue 33: `rls top` in an 80-column terminal (tmux) keeps its candidate table unwrapped,
and `q` quits it, as in `top`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
from conftest import wait_until
from envoy.service.ratelimit.v3 import rls_pb2_grpc
from support.calls import descriptor, request
from support.terminal import rls_top

# Before: one candidate row of 105 characters (wrapped at 80); now a heading and a row of 77.
CONFIG = """domain: gateway_public
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5}
    candidates:
      - {name: halve, requests_per_unit: 2}
"""
DOMAIN = "gateway_public"


def test_rls_top_fits_80_columns_and_q_quits(rls_factory: Callable[..., object],
                                              tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG)
    proc = rls_factory(cfg)
    with grpc.insecure_channel(proc.grpc_addr) as channel:  # type: ignore[attr-defined]
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        for _ in range(8):  # 6 over the candidate's 2, 3 over the live 5
            stub.ShouldRateLimit(
                request(DOMAIN, descriptor(("user", "someone@example.com"))),
                timeout=10,
            )
    with rls_top(proc.http_url, 80, 30) as term:  # type: ignore[attr-defined]
        def screen() -> list[str]:
            return term.screen().splitlines()

        wait_until(lambda: "WOULD BE LIMITED BY CANDIDATE LIMITS (not enforced)" in screen(),
                   timeout=20, what="rls top's candidate table")
        lines = screen()
        table = lines[lines.index("WOULD BE LIMITED BY CANDIDATE LIMITS (not enforced)") + 1:]
        assert table[1] == f"{DOMAIN}.user ~ halve", lines
        row = table[2].split()
        assert (row[:2], row[-1]) == ([DOMAIN, "6"], "user=someone@example.com"), lines
        assert "q: quit" in lines
        term.press("q")
        term.wait_closed("rls top to exit on q")
