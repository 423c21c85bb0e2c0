"""Fixtures for tests of a running rls: one long-lived `rls serve` per backend, shared by the
tests of a package (they use fresh descriptor values, so they never share a counter), plus a
Redis of their own, and `spawner` for a test that needs an rls of its own. A package uses them
by importing them into its conftest.py (admin/, observability/, process/).

The shared servers run with RLS_ADMIN_TOKEN set (mutating calls send the token) and a short
reload interval (config-error tests).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import RedisServer, RlsProcess, free_port, http_get, start_redis, wait_until

from .calls import AUTH, ROOT, TOKEN, http

SHARED_CONFIG = {
    "ops.yaml": """
domain: ops
descriptors:
  - key: k                      # counter query / add
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: two                    # reaches OVER_LIMIT quickly
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: app
    descriptors:
      - key: path
        rate_limit: {name: app_path, unit: minute, requests_per_unit: 100}
  - key: multi                  # two limits on one node
    rate_limits:
      - {unit: second, requests_per_unit: 1000}
      - {unit: day, requests_per_unit: 7}
  - key: user                   # default key: one series whatever the user value
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: duser                  # detailed_metric: one series per value
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: big
    rate_limit: {unit: day, requests_per_unit: 1000000}
""",
    "sw.yaml": """
domain: sw1
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1}
""",
    "sw2.yaml": """
domain: sw2
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1}
""",
    "usage.yaml": """
domain: usage
usage_stats:
  days: 2
  timezone: Pacific/Kiritimati   # UTC+14: a day that is never the day of Etc/GMT+12
  calls: ["app", "app,interface"]
  distinct: [{key: user, per: app}]
descriptors:
  - key: app
    descriptors:
      - key: interface
        value: limited
        rate_limit: {unit: hour, requests_per_unit: 2}
      - key: interface
        rate_limit: {unit: hour, requests_per_unit: 1000}
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 1000}
""",
}


def spawn(
    log_dir: Path,
    *config: str | Path,
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    wait_healthy: bool = True,
) -> RlsProcess:
    """`python -m rls serve` on free ports (like tests/conftest.py's rls_factory, any scope)."""
    grpc_port, http_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "rls", "serve",
           "--grpc-addr", f"127.0.0.1:{grpc_port}", "--http-addr", f"127.0.0.1:{http_port}"]
    for c in config:
        cmd += ["--config", str(c)]
    cmd += list(args)
    log_path = log_dir / f"rls-{grpc_port}.log"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RLS_")}
    full_env.update(env or {})
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                                cwd=str(ROOT))
    rls = RlsProcess(proc, grpc_port, http_port, log_path)
    if wait_healthy:
        try:
            wait_until(lambda: http_get(rls.http_url + "/healthcheck")[0] == 200,
                       timeout=30, what="rls /healthcheck")
        except TimeoutError:
            rls.stop()
            raise AssertionError(f"rls did not become healthy:\n{rls.log()}") from None
    return rls


@pytest.fixture(scope="package")
def ops_redis() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()


@pytest.fixture(scope="package")
def shared_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ops-config")
    for name, text in SHARED_CONFIG.items():
        (folder / name).write_text(text)
    return folder


@pytest.fixture(scope="package", params=["memory", "redis"])
def srv(request, shared_config: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
    RlsProcess
]:
    """A shared server per backend, with RLS_ADMIN_TOKEN set; `srv.backend` names it."""
    args: tuple[str, ...] = ("--reload-interval", "0.2")
    if request.param == "redis":
        redis_server = request.getfixturevalue("ops_redis")
        args += ("--redis-url", redis_server.url, "--backend-timeout-ms", "2000")
    logs = tmp_path_factory.mktemp(f"ops-{request.param}")
    server = spawn(logs, shared_config, args=args, env={"RLS_ADMIN_TOKEN": TOKEN})
    server.backend = request.param  # type: ignore[attr-defined]
    yield server
    server.stop()


@pytest.fixture
def switches_reset(srv: RlsProcess) -> Iterator[RlsProcess]:
    """Turn every runtime switch off before and after the test."""
    off = {"shadow_mode": False, "limiting_off": False, "shadow_domains": []}
    status, body = http(srv.http_url, "POST", "/switches", off, headers=AUTH)
    assert status == 200, body
    yield srv
    http(srv.http_url, "POST", "/switches", off, headers=AUTH)


@pytest.fixture
def spawner(tmp_path: Path) -> Iterator:
    """Like rls_factory, with a start-up timeout that survives a loaded machine (workers)."""
    started: list[RlsProcess] = []

    def start(*config: str | Path, **kwargs) -> RlsProcess:
        server = spawn(tmp_path, *config, **kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


WORKERS_CONFIG = """
domain: sw1
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1}
"""


@pytest.fixture(scope="package")
def workers_srv(ops_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
    RlsProcess
]:
    """`rls serve --workers 2 --redis-url …` (no admin token), once both workers serve;
    `workers_srv.config_dir` is its config directory (reloaded every 0.2 s)."""
    folder = tmp_path_factory.mktemp("workers-config")
    (folder / "sw.yaml").write_text(WORKERS_CONFIG)
    logs = tmp_path_factory.mktemp("workers-logs")
    server = spawn(logs, folder, args=("--workers", "2", "--redis-url", ops_redis.url,
                                        "--reload-interval", "0.2"))
    server.config_dir = folder  # type: ignore[attr-defined]
    try:
        wait_until(lambda: server.log().count("rls serving") >= 2, timeout=30,
                   what="both workers serving")
    except TimeoutError:
        server.stop()
        raise AssertionError(f"the workers did not both start:\n{server.log()}") from None
    yield server
    server.stop()
