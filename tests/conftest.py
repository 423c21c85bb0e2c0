"""Shared fixtures: real redis-server processes on free ports, and `rls serve` subprocesses.

Nothing here uses the machine's own Redis on 6379: every server is started by the tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.net import free_port
from support.processes import stop_process
from support.redis_server import RedisServer, start_redis
from support.waiting import wait_until

from rls.stores.base import Backend
from rls.stores.memory import MemoryBackend
from rls.stores.redis import RedisBackend

__all__ = [  # re-exported for the suites that import them from conftest
    "ROOT", "RedisServer", "RlsProcess", "free_port", "http_get", "start_redis", "wait_until",
]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """A flushed Redis for this test."""
    redis_server.client().flushall()
    return redis_server.url


@pytest.fixture(params=["memory", "redis"])
async def memory_or_redis(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    """The same test on the in-process store and on a real Redis (started, then closed)."""
    if request.param == "memory":
        yield MemoryBackend(sweep_interval=0)
        return
    store = RedisBackend(request.getfixturevalue("redis_url"), timeout_ms=2000)
    await store.start()
    yield store
    await store.close()


@dataclass
class RlsProcess:
    proc: subprocess.Popen[bytes]
    grpc_port: int
    http_port: int
    log_path: Path
    extproc_port: int = 0  # --extproc-addr (the response cache's ext_proc listener)

    @property
    def grpc_addr(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def extproc_addr(self) -> str:
        return f"127.0.0.1:{self.extproc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        stop_process(self.proc, 10)
        return self.proc.returncode


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def rls_factory(tmp_path: Path) -> Iterator[Callable[..., RlsProcess]]:
    """Start `python -m rls serve` with the given config paths and extra flags/env."""
    started: list[RlsProcess] = []

    def start(*config: str | Path, args: tuple[str, ...] = (), env: dict[str, str] | None = None,
              wait_healthy: bool = True) -> RlsProcess:
        grpc_port, http_port, extproc_port = free_port(), free_port(), free_port()
        cmd = [sys.executable, "-m", "rls", "serve",
               "--grpc-addr", f"127.0.0.1:{grpc_port}",
               "--http-addr", f"127.0.0.1:{http_port}",
               "--extproc-addr", f"127.0.0.1:{extproc_port}"]
        for c in config:
            cmd += ["--config", str(c)]
        cmd += list(args)
        log_path = tmp_path / f"rls-{grpc_port}.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("RLS_")}
        full_env.update(env or {})
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                                    cwd=str(ROOT))
        rls = RlsProcess(proc, grpc_port, http_port, log_path, extproc_port)
        started.append(rls)
        if wait_healthy:
            try:
                wait_until(lambda: http_get(rls.http_url + "/healthcheck")[0] == 200,
                           timeout=30.0, what="rls /healthcheck")
            except TimeoutError:
                raise AssertionError(f"rls did not become healthy:\n{rls.log()}") from None
        return rls

    yield start
    for rls in started:
        rls.stop()


# --- markers -------------------------------------------------------------------------------
# Every test gets one kind, derived from where it lives and what it uses, so that
# `pytest -m unit` is the fast loop and `-m "not slow"` skips the long ones:
#   slow  - load, fault, observability (real Prometheus) and quota (real Envoy, windows) suites,
#           deploy (the chart under real helm, the image on a Debian root filesystem), and a
#           test marked slow itself (a fresh venv installed from the index)
#   envoy - tests that start a real Envoy
#   redis - tests that use a real redis-server (a fixture, or an rls process on one)
#   unit  - the rest: in process, no external server
SLOW_DIRS = {"load", "faults", "observability", "quota", "deploy"}
ENVOY_DIRS = {"e2e"}
ENVOY_FILES = {"test_cache_e2e.py", "test_demo.py", "test_demo_quota.py", "test_envoy_quota.py",
               "test_xds_envoy.py",
               "test_envoy_mtls.py"}
REDIS_DIRS = {"redis_topologies", "redis_path", "algorithms", "counters"}
REDIS_FIXTURES = {"redis_server", "redis_url", "fresh_redis", "ops_redis", "debug_redis",
                  "redis_servers", "auth_redis", "tls_redis"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        folder = parts[0] if len(parts) > 1 else ""
        fixtures = set(getattr(item, "fixturenames", ()))
        if folder in SLOW_DIRS:
            item.add_marker(pytest.mark.slow)
        if folder in ENVOY_DIRS or parts[-1] in ENVOY_FILES:
            item.add_marker(pytest.mark.envoy)
        elif folder in REDIS_DIRS or fixtures & REDIS_FIXTURES or "srv" in fixtures:
            item.add_marker(pytest.mark.redis)
        elif (folder not in SLOW_DIRS and "rls_factory" not in fixtures
              and item.get_closest_marker("slow") is None):  # marked slow by the test itself
            item.add_marker(pytest.mark.unit)
