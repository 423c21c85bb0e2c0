"""Module-scoped `rls serve` processes for the fuzz tests (one server per test module).

The shared `rls_factory` fixture is function-scoped; fuzzing hundreds of inputs against one
long-lived server is the point here (state accumulates, the process must stay healthy), so
this starts the same subprocess once per module.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import ROOT, RlsProcess, free_port, http_get, wait_until


@pytest.fixture(scope="module")
def rls_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., RlsProcess]]:
    started: list[RlsProcess] = []

    def start(config_text: str, args: tuple[str, ...] = ()) -> RlsProcess:
        workdir = tmp_path_factory.mktemp("rls-fuzz")
        config = workdir / "fuzz.yaml"
        config.write_text(config_text)
        grpc_port, http_port = free_port(), free_port()
        cmd = [sys.executable, "-m", "rls", "serve",
               "--grpc-addr", f"127.0.0.1:{grpc_port}",
               "--http-addr", f"127.0.0.1:{http_port}",
               "--config", str(config), *args]
        log_path = Path(workdir) / "rls.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("RLS_")}
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    cwd=str(ROOT))
        rls = RlsProcess(proc, grpc_port, http_port, log_path)
        started.append(rls)
        try:  # 30 s: on a loaded machine the interpreter start alone can take seconds
            wait_until(lambda: http_get(rls.http_url + "/healthcheck")[0] == 200,
                       timeout=30, what="rls /healthcheck")
        except TimeoutError:
            raise AssertionError(f"rls did not become healthy:\n{rls.log()}") from None
        return rls

    yield start
    for rls in started:
        rls.stop()
