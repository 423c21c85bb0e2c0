"""Fixtures of the gRPC TLS suite: certificates made by openssl for each test module."""

from __future__ import annotations

import pytest
from e2e import conftest as e2e_fixtures

from .helpers import Pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki.create(tmp_path_factory.mktemp("pki"))


# Real Envoy and the recording backend: the end-to-end suite's fixtures, shared.
envoy_binary = e2e_fixtures.envoy_binary
backend = e2e_fixtures.backend
gateway_factory = e2e_fixtures.gateway_factory
