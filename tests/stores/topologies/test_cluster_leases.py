"""Leased counters (`--redis-leases`) on a Redis Cluster (3 masters): each counter's lease record
lives in its counter's hash slot (rls/stores/redis/leases.py `record_key`), so two leasing
processes under three times the limit's demand admit at most the limit on every counter,
whichever master holds it, and a key whose braces name no hash tag goes to Redis per call."""

from __future__ import annotations

import asyncio
import random

import pytest

from rls.config.model import Limit, Unit
from rls.core.model import Check
from rls.stores.calls import StoreCalls
from rls.stores.deadline import LoopLag
from rls.stores.redis import RedisBackend
from rls.stores.redis.leases import DECISIONS, record_key

from .servers import ClusterTopology

pytestmark = pytest.mark.redis

NOW = 1_700_000_000_000 + 1_234


async def leasing(url: str) -> RedisBackend:
    backend = RedisBackend(url, timeout_ms=5000, connect_timeout_ms=5000, leases=[0.0] * 6)
    assert backend.leases is not None
    backend.leases._now_ms = lambda: NOW
    await backend.start()
    return backend


async def test_leases_on_counters_spread_over_the_masters_never_pass_their_limits(
    fresh_cluster: ClusterTopology,
) -> None:
    limit = Limit(requests_per_unit=400, unit=Unit.MINUTE, full_key="cl.lease")
    keys = [f"cluster-lease:{i}" for i in range(6)]  # no hash tag: spread over the slots
    backends = [await leasing(fresh_cluster.url) for _ in range(2)]
    try:
        processes = [StoreCalls(b, LoopLag(), 5000, 10_000) for b in backends]
        rng = random.Random(3)
        admitted = dict.fromkeys(keys, 0)

        async def caller(calls: StoreCalls) -> None:
            for _ in range(600):
                key = rng.choice(keys)
                hits = rng.randint(1, 2)
                outcomes, why = await calls.decide([Check(0, limit, key, hits)], NOW, (), 0, None)
                assert outcomes is not None, why
                if outcomes[0].ok:
                    admitted[key] += hits
                await asyncio.sleep(0)

        await asyncio.gather(*(caller(calls) for calls in processes for _ in range(2)))
        assert all(n <= 400 for n in admitted.values()), admitted
        assert all(n >= 392 for n in admitted.values()), admitted
        assert sum(b.leases.counts[DECISIONS] for b in backends if b.leases) > 0
    finally:
        for backend in backends:
            await backend.close()


def test_a_key_whose_braces_name_no_hash_tag_gets_no_lease_record() -> None:
    assert record_key("plain@5") == "{plain@5}!lease"
    assert record_key("a{tag}b@5") == "a{tag}b@5!lease"
    assert record_key("a}b{@5") is None
    assert record_key("a{}b@5") is None
