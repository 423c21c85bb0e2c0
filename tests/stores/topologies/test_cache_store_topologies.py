"""The response cache connects through rls's one Redis connector: Sentinel and Cluster URLs
work for the cache store as they do for counters (entries, TTLs, versions)."""

from __future__ import annotations

import pytest

from rls.response_cache.store import create_store

from .servers import ClusterTopology, SentinelTopology

pytestmark = pytest.mark.redis


async def _round_trip(url: str) -> None:
    store = create_store(url, timeout_ms=2000)
    try:
        keys = [f"rls:cache:test:{i}" for i in range(20)]  # spread over the cluster's slots
        for i, key in enumerate(keys):
            await store.set(key, f"body-{i}".encode(), 60)
        assert [await store.get(k) for k in keys] == [f"body-{i}".encode() for i in range(20)]
        await store.expire(keys[0], 120)
        await store.set_version("rls:cache:version:api", b"3")
        assert await store.get_version("rls:cache:version:api") == b"3"
        assert await store.get("rls:cache:test:absent") is None
    finally:
        await store.close()


async def test_cache_store_on_redis_cluster(fresh_cluster: ClusterTopology) -> None:
    await _round_trip(fresh_cluster.url)
    node = fresh_cluster.masters[0].client()
    assert node.cluster("countkeysinslot", 0) is not None  # the cluster is really serving


async def test_cache_store_on_redis_sentinel(sentinel: SentinelTopology) -> None:
    await _round_trip(sentinel.url())
    assert sentinel.primary.client().get("rls:cache:test:0") == b"body-0"
