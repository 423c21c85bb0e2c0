"""Fixtures: each topology is started once per module (Sentinel per test: failover destroys it)
and always stopped by the fixture's finalizer, also when a test or the start-up fails."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .servers import (
    AuthSetup,
    ClientCert,
    ClusterTopology,
    SentinelTopology,
    TlsFiles,
    Topology,
    make_client_cert,
    make_tls_files,
    start_auth_redis,
    start_cluster,
    start_sentinel,
    start_tls_redis,
)
from .servers import Proc as RedisProc


def _cluster(factory: pytest.TempPathFactory, replicas: int) -> Iterator[ClusterTopology]:
    topo = start_cluster(factory.mktemp("cluster"), masters=3, replicas=replicas)
    try:
        yield topo
    finally:
        topo.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterTopology]:
    yield from _cluster(tmp_path_factory, replicas=0)


@pytest.fixture
def cluster_with_replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterTopology]:
    """3 masters with a replica each, per test: a failover destroys it."""
    yield from _cluster(tmp_path_factory, replicas=1)


@pytest.fixture
def fresh_cluster(cluster: ClusterTopology) -> ClusterTopology:
    cluster.flush()
    return cluster


@pytest.fixture
def sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelTopology]:
    topo = start_sentinel(tmp_path_factory.mktemp("sentinel"))
    try:
        yield topo
    finally:
        topo.stop()


# Distinct, greppable secrets; the ACL user's contains URL-special characters (percent-encoded
# in the URL), so the test also covers unquoting.
DEFAULT_PASSWORD = "dflt-S3cret-4f2a"
ACL_USER = "app"
ACL_PASSWORD = "app-S3cret@7:c9"


@pytest.fixture(scope="module")
def auth_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthSetup]:
    workdir = tmp_path_factory.mktemp("auth")
    topo = Topology(workdir)
    try:
        yield start_auth_redis(workdir, topo, DEFAULT_PASSWORD, ACL_USER, ACL_PASSWORD)
    finally:
        topo.stop()


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls-certs"))


@pytest.fixture(scope="module")
def client_cert(tmp_path_factory: pytest.TempPathFactory, tls_files: TlsFiles) -> ClientCert:
    return make_client_cert(tmp_path_factory.mktemp("tls-client"), tls_files)


@pytest.fixture(scope="module")
def mtls_redis(tmp_path_factory: pytest.TempPathFactory, tls_files: TlsFiles,
               client_cert: ClientCert) -> Iterator[RedisProc]:
    """A TLS-only redis-server that requires a client certificate signed by its CA."""
    workdir = tmp_path_factory.mktemp("mtls")
    topo = Topology(workdir)
    try:
        yield start_tls_redis(workdir, topo, tls_files, client_cert)
    finally:
        topo.stop()


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory, tls_files: TlsFiles) -> Iterator[RedisProc]:
    workdir = tmp_path_factory.mktemp("tls")
    topo = Topology(workdir)
    try:
        yield start_tls_redis(workdir, topo, tls_files)
    finally:
        topo.stop()
