"""scripts/xds_server.py, the documented example management server: rls follows the YAML
files it serves, and a changed file reaches rls as a new version."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import ROOT
from support.net import connectable, free_port
from support.processes import stop_process
from support.waiting import wait_until

from .calls import OK, OVER_LIMIT, decide

LIMITS = """
domain: example
descriptors:
  - key: user
    rate_limit: {unit: MINUTE, requests_per_unit: %d}
"""


def test_rls_follows_the_example_server_and_its_file_changes(
    tmp_path: Path, rls_factory: Callable[..., Any]
) -> None:
    limits = tmp_path / "limits.yaml"
    limits.write_text(LIMITS % 1)
    port = free_port()
    log_path = tmp_path / "xds_server.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [sys.executable, str(ROOT / "scripts" / "xds_server.py"), "--port", str(port),
             str(limits)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: connectable(port), 15, "the example server", log_path.read_text)
        rls = rls_factory(env={"CONFIG_TYPE": "GRPC_XDS_SOTW",
                               "CONFIG_GRPC_XDS_SERVER_URL": f"127.0.0.1:{port}"})
        assert decide(rls.grpc_addr, "example", ("user", "a")) == OK
        assert decide(rls.grpc_addr, "example", ("user", "a")) == OVER_LIMIT
        limits.write_text(LIMITS % 3)
        wait_until(lambda: "ACKed version 2" in log_path.read_text(), 15, "version 2 ACKed",
                   log_path.read_text)
        assert decide(rls.grpc_addr, "example", ("user", "a")) == OK  # 2 of 3
    finally:
        stop_process(server)
