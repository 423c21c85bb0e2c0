"""Fixtures of the gRPC TLS suite: certificates made by openssl for each test module."""

from __future__ import annotations

import pytest

from .helpers import Pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki.create(tmp_path_factory.mktemp("pki"))
