"""Issue 33, "small contradictions": what the docs say and what rls does agree.

Each test runs the behaviour and reads the sentence of the docs that describes it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from conftest import http_get, wait_until
from support.net import free_port

from .helpers import ROOT

GOOD = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"


def flat(doc: str) -> str:
    return " ".join((ROOT / doc).read_text().split())


def test_healthcheck_is_500_store_not_ready_with_a_config_and_no_store(
        rls_factory: Callable[..., object], tmp_path: Path) -> None:
    cfg = tmp_path / "d.yaml"
    cfg.write_text(GOOD)
    rls = rls_factory(cfg, args=("--redis-url", f"redis://127.0.0.1:{free_port()}/0"),
                      wait_healthy=False)
    url = rls.http_url + "/healthcheck"  # type: ignore[attr-defined]

    def answered() -> bool:
        try:
            return http_get(url)[0] != 0
        except OSError:  # the admin port is not open yet
            return False

    wait_until(answered, timeout=30.0, what="/healthcheck answers")
    assert http_get(url) == (500, b"store not ready\n")
    for doc in ("README.md", "docs/admin.md"):
        assert "store not ready" in flat(doc), doc
