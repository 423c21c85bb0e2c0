"""Fixtures of the xDS suites: an in-test ADS server (ads_server.AdsServer) and `rls serve`
with CONFIG_TYPE=GRPC_XDS_SOTW pointed at it (short back-offs so reconnects are quick)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .ads_server import AdsServer


@pytest.fixture
def ads() -> Iterator[AdsServer]:
    server = AdsServer().start()
    yield server
    server.stop()


def xds_env(ads: AdsServer, **extra: str) -> dict[str, str]:
    """The reference's variables for `rls serve` against `ads` (node id `init-test-node`)."""
    return {
        "CONFIG_TYPE": "GRPC_XDS_SOTW",
        "CONFIG_GRPC_XDS_SERVER_URL": ads.url,
        "CONFIG_GRPC_XDS_NODE_ID": "init-test-node",
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "100ms",
        "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "100ms",
        "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "500ms",
        **extra,
    }


@pytest.fixture
def xds_rls(rls_factory: Callable[..., Any], ads: AdsServer) -> Callable[..., Any]:
    """`xds_rls(**env)`: rls on `ads` with the reference's variables plus `env`."""

    def start(wait_healthy: bool = True, args: tuple[str, ...] = (), **env: str) -> Any:
        return rls_factory(args=args, env=xds_env(ads, **env), wait_healthy=wait_healthy)

    return start
