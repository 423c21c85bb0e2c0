"""The reservation records of `reserve:` (rls/stores/reservations.py): the memory store and
Redis agree on every rule.

Open records a reservation once; a settle takes it once (a second finds it settled, also when
both run at once); a settle without one leaves a tombstone so that a repeat is a no-op; expiry
drops records (open ones count as expired); the byte bound refuses new records, never old ones.
"""

from __future__ import annotations

import asyncio

import pytest

from rls.config.loader import load_files
from rls.engine.limiter import OK, DescriptorIn, RateLimiter
from rls.observability.metrics import Metrics
from rls.settings import Settings
from rls.stores.base import Backend
from rls.stores.redis import RedisBackend
from rls.stores.reservations import (
    NONE,
    OPEN,
    RECORD_BYTES,
    SETTLED,
    Found,
    Opening,
    ReservationStore,
    member,
    reservations_for,
)

NOW = 1_700_000_000_000
M1, M2 = member("rl:llm_tenant_acme", "r1"), member("rl:llm_tenant_acme", "r2")


def book(backend: Backend, max_bytes: int = 1 << 20) -> tuple[ReservationStore, list[int]]:
    expired: list[int] = []
    return reservations_for(backend, "rl:", max_bytes, expired.append), expired


async def test_a_reservation_is_taken_once(memory_or_redis: Backend) -> None:
    store, _ = book(memory_or_redis)
    assert await store.open([Opening(M1, 800, NOW + 3_600_000, 60_000)], NOW) == [True]
    assert store.open_count == 1
    assert await store.open([Opening(M1, 500, 0, 60_000)], NOW) == [False]  # already there
    got = await store.settle([(M1, 60_000)], NOW + 1)
    assert got == [Found(OPEN, 800, NOW + 3_600_000)]
    assert store.open_count == 0
    assert await store.settle([(M1, 60_000)], NOW + 2) == [Found(SETTLED)]


async def test_a_settle_without_reservation_leaves_a_tombstone(memory_or_redis: Backend) -> None:
    store, _ = book(memory_or_redis)
    assert await store.settle([(M2, 60_000)], NOW) == [Found(NONE)]
    assert await store.settle([(M2, 60_000)], NOW + 1) == [Found(SETTLED)]
    # Until the tombstone expires.
    assert await store.settle([(M2, 60_000)], NOW + 60_001) == [Found(NONE)]


async def test_concurrent_settles_apply_once(memory_or_redis: Backend) -> None:
    store, _ = book(memory_or_redis)
    await store.open([Opening(M1, 800, 0, 60_000)], NOW)
    answers = await asyncio.gather(*(store.settle([(M1, 60_000)], NOW + 1) for _ in range(8)))
    states = sorted(found[0].state for found in answers)
    assert states == [OPEN] + [SETTLED] * 7


async def test_expiry_drops_records_and_counts_open_ones(memory_or_redis: Backend) -> None:
    store, expired = book(memory_or_redis)
    await store.open([Opening(M1, 800, 0, 10_000), Opening(M2, 800, 0, 20_000)], NOW)
    await store.settle([(M2, 20_000)], NOW + 1)
    await store.sweep(NOW + 10_000)
    assert sum(expired) == 1 and store.open_count == 0
    await store.sweep(NOW + 20_000)  # the settled one goes without counting
    assert sum(expired) == 1 and store.nbytes == 0
    assert await store.settle([(M1, 10_000)], NOW + 20_001) == [Found(NONE)]


async def test_the_byte_bound_refuses_new_records(memory_or_redis: Backend) -> None:
    room = 2 * (RECORD_BYTES + len(M1))
    store, _ = book(memory_or_redis, room)
    third = member("rl:llm_tenant_acme", "r3")
    got = await store.open(
        [Opening(M1, 1, 0, 10_000), Opening(M2, 1, 0, 10_000), Opening(third, 1, 0, 10_000)],
        NOW,
    )
    assert got == [True, True, False]
    assert store.nbytes == room
    # Expiry makes room again.
    assert await store.open([Opening(third, 1, 0, 10_000)], NOW + 10_000) == [True]


def test_a_long_request_id_is_kept_by_its_digest() -> None:
    long_id = "x" * 10_000
    assert len(member("k", long_id)) < 100
    assert member("k", long_id) != member("k", long_id + "y")


@pytest.mark.parametrize("rid", ["r1", "a\x1fb"])
def test_members_of_different_counters_differ(rid: str) -> None:
    assert member("rl:a", rid) != member("rl:b", rid)


REPLICAS_YAML = """
domain: llm
descriptors:
  - key: tenant
    rate_limit:
      unit: hour
      requests_per_unit: 2000
      reserve: {estimate: 800, id_key: request_id, settle_key: settle}
"""


async def test_another_replica_settles_once(redis_url: str) -> None:
    """Two rls replicas on one Redis: a reservation made on one is settled on the other, and
    the same settle sent to both at once applies once."""
    config = load_files([("llm.yaml", REPLICAS_YAML)])
    backends = [RedisBackend(redis_url, timeout_ms=2000, connect_timeout_ms=2000) for _ in range(2)]
    for backend in backends:
        await backend.start()
    try:
        a, b = (RateLimiter(lambda: config, backend, Settings(), Metrics()) for backend in backends)
        now = NOW - NOW % 3_600_000 + 1_000
        tenant = ("tenant", "acme")
        reserve = DescriptorIn((tenant, ("request_id", "r1")), 0)
        settle = DescriptorIn((tenant, ("request_id", "r1"), ("settle", "1")), 300)
        assert (await a.should_rate_limit("llm", [reserve], now_ms=now)).overall == OK
        await asyncio.gather(
            a.should_rate_limit("llm", [settle], now_ms=now),
            b.should_rate_limit("llm", [settle], now_ms=now),
        )
        (((_, outcome),),) = await b.query("llm", [DescriptorIn((tenant,), 0)], now_ms=now)
        assert outcome.used == 300
    finally:
        for backend in backends:
            await backend.close()
