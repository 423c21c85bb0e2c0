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
    store = RedisBackend(request.getfixturevalue("redis_url"), timeout_ms=2000,
                         connect_timeout_ms=2000)
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


PORT_ATTEMPTS = 3  # rls_factory: starts on new ports after a port was taken before rls bound it


@pytest.fixture
def rls_factory(tmp_path: Path) -> Iterator[Callable[..., RlsProcess]]:
    """Start `python -m rls serve` with the given config paths and extra flags/env."""
    started: list[RlsProcess] = []

    def start(*config: str | Path, args: tuple[str, ...] = (), env: dict[str, str] | None = None,
              wait_healthy: bool = True) -> RlsProcess:
        # A port free_port() found free can be taken before rls binds it (an outgoing
        # connection's ephemeral port): rls then exits saying so, and is started again on
        # other ports. Any other failure to become healthy fails the test.
        for attempt in range(PORT_ATTEMPTS):
            rls = spawn(config, args, env)
            if not wait_healthy:
                return rls
            try:
                wait_until(lambda r=rls: r.proc.poll() is not None
                           or http_get(r.http_url + "/healthcheck")[0] == 200,
                           timeout=30.0, what="rls /healthcheck")
            except TimeoutError:
                raise AssertionError(f"rls did not become healthy:\n{rls.log()}") from None
            if rls.proc.poll() is None:
                return rls
            if "is already in use" not in rls.log() or attempt == PORT_ATTEMPTS - 1:
                raise AssertionError(f"rls exited before it was healthy:\n{rls.log()}")
        raise AssertionError("unreachable")

    def spawn(config: tuple[str | Path, ...], args: tuple[str, ...],
              env: dict[str, str] | None) -> RlsProcess:
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
        return rls

    yield start
    for rls in started:
        rls.stop()


# --- markers -------------------------------------------------------------------------------
# Markers are set per test by what it uses, never by the folder it lives in:
#   unit  - in process, no external server: the fast loop, `pytest -m unit`
#   redis - uses a real redis-server (one of the fixtures below, or an rls process on one)
#   envoy - starts a real Envoy (modules say so with `pytestmark = pytest.mark.envoy`)
#   process - runs rls in a subprocess: `rls serve`, `/bin/ratelimit` or a sub-command
#   slow  - load, faults, long end-to-end runs (modules say so with `pytestmark`)
# `redis`, `envoy` and `process` are derived from the fixtures a test uses where that is
# reliable, and otherwise set with `pytestmark`; a test with none of them is `unit`, and the
# guard below fails a `unit` test that starts a server or an rls process anyway, so a missing
# marker cannot slip a server into the fast loop.
REDIS_FIXTURES = {"redis_server", "redis_url", "fresh_redis", "ops_redis", "debug_redis",
                  "redis_servers", "auth_redis", "tls_redis", "mtls_redis", "own_redis",
                  "paused_redis", "redis_stack"}
REDIS_PARAMS = {"redis", "cluster", "sentinel"}
ENVOY_FIXTURES = {"envoy_binary"}
PROCESS_FIXTURES = {"rls_factory", "srv", "spawner", "rls_module"}
NOT_UNIT = {"redis", "envoy", "process", "slow"}
SERVER_PROGRAMS = {"redis-server", "redis-sentinel", "envoy", "prometheus", "promtool", "rls",
                   "ratelimit", "tmux", "ssdb-server"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & ENVOY_FIXTURES:
            item.add_marker(pytest.mark.envoy)
        params = getattr(getattr(item, "callspec", None), "params", {})
        # A store parameter ("redis", "cluster") whose fixture asks for Redis when it runs.
        redis_param = any(isinstance(v, str) and v in REDIS_PARAMS for v in params.values())
        if fixtures & REDIS_FIXTURES or redis_param:
            item.add_marker(pytest.mark.redis)
        if fixtures & PROCESS_FIXTURES:
            item.add_marker(pytest.mark.process)
        if not {m.name for m in item.iter_markers()} & NOT_UNIT:
            item.add_marker(pytest.mark.unit)


def _started_program(args: object) -> str | None:
    """The server or rls a Popen argument list starts, if it starts one."""
    argv = [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()
    if not argv:
        return None
    program = Path(argv[0]).name
    if program in SERVER_PROGRAMS:
        return program
    if len(argv) >= 3 and argv[1] == "-m" and argv[2].split(".")[0] == "rls":
        return "rls"
    return None


def _refuse_servers(real_init: Callable[..., None]) -> Callable[..., None]:
    def guarded(self: subprocess.Popen[bytes], args: object, *rest: object,
                **kwargs: object) -> None:
        program = _started_program(args)
        if program is not None:
            raise AssertionError(
                f"this test is marked unit but starts {program}: mark it process (or "
                "redis/envoy/slow), see tests/README.md")
        real_init(self, args, *rest, **kwargs)

    return guarded


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A `unit` test that starts redis-server, Envoy, Prometheus or rls fails, naming it: also
    from a fixture of any scope, which is set up and torn down inside this protocol."""
    if item.get_closest_marker("unit") is None:
        yield
        return
    real_init = subprocess.Popen.__init__
    subprocess.Popen.__init__ = _refuse_servers(real_init)  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = real_init  # type: ignore[method-assign]
