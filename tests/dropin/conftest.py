"""Fixtures of the drop-in suite: a world-readable root standing for the container's `/`, and
`ratelimit` processes stopped at the end of each test."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from config.xds.ads_server import AdsServer

from .helpers import EgCertificates, Ratelimit, start_eg_ads, start_ratelimit, world_readable_root


@pytest.fixture
def root() -> Iterator[Path]:
    path = world_readable_root()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def launch(root: Path, tmp_path: Path) -> Iterator[Callable[..., Ratelimit]]:
    """start_ratelimit in `root` (the working directory), logs in tmp_path."""
    started: list[Ratelimit] = []

    def start(env: dict[str, str], user: int | None = None,
              wait_healthy: bool = True) -> Ratelimit:
        rl = start_ratelimit(env, root, tmp_path, user, wait_healthy)
        started.append(rl)
        return rl

    yield start
    for rl in started:
        rl.stop()


@pytest.fixture
def eg_ads() -> Iterator[Callable[[EgCertificates], AdsServer]]:
    """start_eg_ads, the servers stopped at the end of the test."""
    started: list[AdsServer] = []

    def start(certs: EgCertificates) -> AdsServer:
        server = start_eg_ads(certs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
