"""Counters on Redis Cluster: a batch spread over slots is one script call per slot, a slot
whose master is down fails only its own items (per-item codes), not the batch, and a burst
beyond the connection pool waits for connections instead of failing."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry
from stores.topologies.servers import start_cluster

from rls.frequency.model import CountersConfig, make_item
from rls.frequency.service import CountersService
from rls.stores import create_backend

pytestmark = pytest.mark.redis


@pytest.fixture
def cluster(tmp_path_factory):
    """A cluster per test: the down-master test stops one of its masters."""
    topo = start_cluster(tmp_path_factory.mktemp("counters-cluster"), masters=3, replicas=0)
    try:
        yield topo
    finally:
        topo.stop()


async def test_cluster_batch_spans_slots_and_a_down_master_fails_only_its_items(cluster):
    cluster.flush()
    backend = create_backend(cluster.url, timeout_ms=500)
    await backend.start()
    cfg = CountersConfig()
    svc = CountersService.for_backend(backend, cfg, CollectorRegistry(), "rl:")
    try:
        items = [make_item(cfg, "d", f"user:{i}", 1, "hour", hits=2) for i in range(30)]
        first = await svc.add(items)
        assert [(r.code, r.freq) for r in first] == [("ok", 2)] * 30
        owners = [cluster.slot_owner(it.base_key("rl:")).port for it in items]
        assert len(set(owners)) == 3  # the batch really spans the three masters
        victim = cluster.masters[0]
        victim.stop()
        second = await svc.add(items)
        for owner, res in zip(owners, second, strict=True):
            if owner == victim.port:
                assert res.code == "unavailable"
            else:
                assert (res.code, res.freq) == ("ok", 4)
    finally:
        await backend.close()


async def test_cluster_burst_beyond_the_pool_waits_instead_of_failing(cluster):
    """200 concurrent Adds through a pool of 4 connections per node: redis-py's cluster client
    raises MaxConnectionsError at once when a node's pool is busy; every Add must be charged."""
    cluster.flush()
    backend = create_backend(cluster.url, timeout_ms=2000, pool_size=4)
    await backend.start()
    cfg = CountersConfig()
    svc = CountersService.for_backend(backend, cfg, CollectorRegistry(), "rl:")
    try:
        items = [make_item(cfg, "d", f"burst:{i % 20}", 1, "hour") for i in range(200)]
        answers = await asyncio.gather(*(svc.add([it]) for it in items))
        assert [r.code for (r,) in answers] == ["ok"] * 200
        totals = await svc.get([make_item(cfg, "d", f"burst:{k}", 1, "hour") for k in range(20)])
        assert [r.freq for r in totals] == [10] * 20
    finally:
        await backend.close()
