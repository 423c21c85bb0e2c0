"""Fixtures for quota mode: real Envoy 1.40 on envoy/gateway-rlqs.yaml, rls on fixed ports.

rls is started here (not with tests/conftest.py's rls_factory) because the restart test needs a
second rls on the same gRPC port the Envoy config points at.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT, RlsProcess, http_get, wait_until
from e2e import conftest as e2e_fixtures
from e2e.harness import (
    ADMIN_PORT,
    BACKEND_PORT,
    LISTENER_PORT,
    RLS_PORT,
    Backend,
    Envoy,
    free_port,
    load_gateway,
    rewrite_ports,
    start_envoy,
)

RLQS_YAML = "gateway-rlqs.yaml"
DOMAIN = "gateway-rlqs"


# The Envoy binary and the upstream backend: the end-to-end suite's fixtures, shared.
envoy_binary = e2e_fixtures.envoy_binary
backend = e2e_fixtures.backend


@dataclass
class QuotaRig:
    """Starts rls processes and Envoys for one test; stops them all at the end."""

    tmp_path: Path
    envoy_binary: str
    backend: Backend
    started_rls: list[RlsProcess]
    started_envoys: list[Envoy]

    def descriptors(self, text: str) -> Path:
        path = self.tmp_path / f"descriptors-{len(self.started_rls)}.yaml"
        path.write_text(text)
        return path

    def rls(
        self, config: Path, grpc_port: int | None = None, redis_url: str = "",
        env: dict[str, str] | None = None, args: tuple[str, ...] = (),
    ) -> RlsProcess:
        grpc_port = grpc_port or free_port()
        http_port = free_port()
        cmd = [sys.executable, "-m", "rls", "serve", "--config", str(config),
               "--grpc-addr", f"127.0.0.1:{grpc_port}", "--http-addr", f"127.0.0.1:{http_port}",
               "--shutdown-delay-ms", "0", "--drain-seconds", "0.5"]
        if redis_url:
            cmd += ["--redis-url", redis_url]
        cmd += list(args)
        log_path = self.tmp_path / f"rls-{len(self.started_rls)}.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("RLS_")}
        full_env.update(env or {})
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                                    cwd=str(ROOT))
        rls = RlsProcess(proc, grpc_port, http_port, log_path)
        self.started_rls.append(rls)
        try:
            wait_until(lambda: http_get(rls.http_url + "/healthcheck")[0] == 200,
                       timeout=30.0, what="rls /healthcheck")
        except TimeoutError:
            raise AssertionError(f"rls did not become healthy:\n{rls.log()}") from None
        return rls

    def envoy(self, rls_port: int) -> Envoy:
        listener, admin = free_port(), free_port()
        config = rewrite_ports(load_gateway(RLQS_YAML), {
            LISTENER_PORT: listener, ADMIN_PORT: admin, RLS_PORT: rls_port,
            BACKEND_PORT: self.backend.port,
        })
        envoy = start_envoy(self.envoy_binary, config, self.tmp_path, listener, admin)
        self.started_envoys.append(envoy)
        return envoy


@pytest.fixture
def rig(tmp_path: Path, envoy_binary: str, backend: Backend) -> Iterator[QuotaRig]:
    r = QuotaRig(tmp_path, envoy_binary, backend, [], [])
    yield r
    for envoy in r.started_envoys:
        envoy.stop()
    for rls in r.started_rls:
        rls.stop()


RigFactory = Callable[..., QuotaRig]
