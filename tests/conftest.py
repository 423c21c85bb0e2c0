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
# Markers are set per test by what it uses, never by the folder it lives in:
#   unit  - in process, no external server: the fast loop, `pytest -m unit`
#   redis - uses a real redis-server (one of the fixtures below, or an rls process on one)
#   envoy - starts a real Envoy (modules say so with `pytestmark = pytest.mark.envoy`)
#   slow  - load, faults, long end-to-end runs (modules say so with `pytestmark`)
# `redis` and `envoy` are derived from the fixtures a test uses where that is reliable; a test
# with no server marker and no server fixture is `unit`.
REDIS_FIXTURES = {"redis_server", "redis_url", "fresh_redis", "ops_redis", "debug_redis",
                  "redis_servers", "auth_redis", "tls_redis"}
ENVOY_FIXTURES = {"envoy_binary"}
PROCESS_FIXTURES = {"rls_factory", "srv", "spawner", "rls_module"}
SERVER_MARKERS = {"redis", "envoy", "slow"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & ENVOY_FIXTURES:
            item.add_marker(pytest.mark.envoy)
        params = getattr(getattr(item, "callspec", None), "params", {})
        if fixtures & REDIS_FIXTURES or params.get("memory_or_redis") == "redis":
            item.add_marker(pytest.mark.redis)
        marked = {m.name for m in item.iter_markers()}
        if not marked & SERVER_MARKERS and not fixtures & PROCESS_FIXTURES:
            item.add_marker(pytest.mark.unit)
