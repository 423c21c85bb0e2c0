"""Leased counters (`--redis-leases`, rls/stores/redis/leases.py) on a real Redis.

- Differential: one process deciding from leases answers every request exactly as the memory
  store does (admission, and each outcome's room, usage and reset), while most of its requests
  never reach Redis.
- Never over the limit: two processes leasing one counter under demand three times its limit
  admit at most the limit, and nearly all of it.
- All or nothing, release when idle and at drain, a lost counter, cold keys and small limits.

The leases' clock is pinned (`now`) so every decision of a test falls in one window.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from conftest import RedisServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rls.config.model import Limit, Unit
from rls.core.model import Check, Outcome
from rls.stores.calls import StoreCalls
from rls.stores.deadline import LoopLag
from rls.stores.memory import MemoryBackend
from rls.stores.redis import RedisBackend
from rls.stores.redis.leases import DECISIONS, HOT_CALLS, LOST, RELEASED, Leases

pytestmark = pytest.mark.redis

NOW = 1_700_000_000_000 + 1_234  # a window's middle for minute and hour limits
_RUN = itertools.count()


def counts() -> list[float]:
    return [0.0] * 6


async def leased_backend(server: RedisServer, now: int = NOW) -> RedisBackend:
    backend = RedisBackend(server.url, timeout_ms=5000, connect_timeout_ms=5000, leases=counts())
    assert backend.leases is not None
    backend.leases._now_ms = lambda: now
    await backend.start()
    return backend


def leases_of(store: RedisBackend | StoreCalls) -> Leases:
    backend = store.backend if isinstance(store, StoreCalls) else store
    assert isinstance(backend, RedisBackend) and backend.leases is not None
    return backend.leases


@pytest.fixture
async def leased(server: RedisServer) -> AsyncIterator[Callable[[], Awaitable[RedisBackend]]]:
    """Started RedisBackends with leases on `server` (flushed first), closed after the test."""
    server.client().flushall()
    made: list[RedisBackend] = []

    async def make() -> RedisBackend:
        backend = await leased_backend(server)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        await backend.close()


def calls_of(backend: RedisBackend) -> StoreCalls:
    return StoreCalls(backend, LoopLag(), 5000, 10_000)


async def decide(calls: StoreCalls, checks: list[Check]) -> list[Outcome]:
    outcomes, why = await calls.decide(checks, NOW, (), 0, None)
    assert outcomes is not None, why
    return outcomes


def counter(server: RedisServer, check: Check) -> int:
    return int(server.client().get(f"{check.key}@{NOW // check.limit.window_ms}") or 0)


async def warm(calls: StoreCalls, checks: list[Check], n: int) -> Leases:
    """`n` decisions of `checks` (enough to lease a hot key), and the refills they started
    landed: the process's leases."""
    for _ in range(n):
        await decide(calls, checks)
    leases = leases_of(calls)
    await settled(leases)
    return leases


async def settled(leases: Leases) -> None:
    """Background calls (refills, give-backs) landed."""
    await asyncio.gather(*leases._background)


requests = st.lists(
    st.lists(st.tuples(st.integers(0, 1), st.integers(0, 12)), min_size=1, max_size=2,
             unique_by=lambda c: c[0]),
    min_size=30, max_size=120,
)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(limits=st.tuples(st.integers(100, 260), st.integers(100, 260)), sequence=requests)
async def test_one_leasing_process_decides_every_request_as_the_memory_store_does(
    server: RedisServer, limits: tuple[int, int], sequence: list[list[tuple[int, int]]]
) -> None:
    run = next(_RUN)
    caps = [Limit(requests_per_unit=n, unit=Unit.MINUTE, full_key=f"l.k{i}")
            for i, n in enumerate(limits)]

    def checks(request: list[tuple[int, int]]) -> list[Check]:
        return [Check(0, caps[k], f"lease{run}:k{k}", hits) for k, hits in request]

    memory = MemoryBackend(sweep_interval=0)
    backend = await leased_backend(server)
    try:
        calls = calls_of(backend)
        for request in sequence:
            expected = memory.decide_now(checks(request), NOW).outcomes
            got = await decide(calls, checks(request))
            assert got == expected, request
        if len(sequence) > 2 * HOT_CALLS:
            assert leases_of(backend).counts[DECISIONS] > 0, "no request was decided from a lease"
    finally:
        await backend.close()


async def test_two_leasing_processes_never_admit_past_the_limit_and_nearly_fill_it(
    server: RedisServer, leased: Callable[[], Awaitable[RedisBackend]],
) -> None:
    limit = Limit(requests_per_unit=1000, unit=Unit.MINUTE, full_key="l.shared")
    check = Check(0, limit, "lease:shared", 1)
    processes = [calls_of(await leased()) for _ in range(2)]
    rng = random.Random(7)
    admitted = 0

    async def caller(calls: StoreCalls, n: int) -> None:
        nonlocal admitted
        for _ in range(n):
            hits = rng.randint(1, 3)
            outcome = (await decide(calls, [Check(0, limit, check.key, hits)]))[0]
            if outcome.ok:
                admitted += hits
            await asyncio.sleep(0)

    # Demand three times the limit: two callers per process, 500 requests of 1-3 hits each.
    await asyncio.gather(*(caller(calls, 500) for calls in processes for _ in range(2)))
    assert admitted <= 1000
    assert admitted >= 980, f"only {admitted} of 1000 admitted: leases stranded the rest"
    assert counter(server, check) <= 1000
    assert sum(leases_of(c).counts[DECISIONS] for c in processes) > 0


async def test_a_request_refused_by_one_check_takes_nothing_from_the_others_lease(
    server: RedisServer, leased: Callable[[], Awaitable[RedisBackend]],
) -> None:
    roomy = Limit(requests_per_unit=1000, unit=Unit.MINUTE, full_key="l.roomy")
    tight = Limit(requests_per_unit=100, unit=Unit.MINUTE, full_key="l.tight")
    calls = calls_of(await leased())
    for _ in range(2 * HOT_CALLS):
        await decide(calls, [Check(0, roomy, "lease:roomy", 1), Check(1, tight, "lease:tight", 5)])
    leases = leases_of(calls)
    assert leases.counts[DECISIONS] > 0
    # Fill the tight counter from elsewhere (another process deciding per call).
    server.client().set(f"lease:tight@{NOW // tight.window_ms}", 100)
    roomy_lease = next(lease for key, lease in leases.leases.items() if "roomy" in key)
    tight_lease = next(lease for key, lease in leases.leases.items() if "tight" in key)
    tight_lease.left = 0  # what it held is spent
    before = roomy_lease.left
    outcomes = await decide(
        calls, [Check(0, roomy, "lease:roomy", 1), Check(1, tight, "lease:tight", 5)]
    )
    assert [o.ok for o in outcomes] == [True, False]
    assert not any(o.charged for o in outcomes)
    assert roomy_lease.left == before


async def test_a_request_refused_by_a_check_decided_per_call_gives_its_leased_hits_back(
    server: RedisServer, leased: Callable[[], Awaitable[RedisBackend]],
) -> None:
    roomy = Limit(requests_per_unit=1000, unit=Unit.MINUTE, full_key="l.roomy2")
    small = Limit(requests_per_unit=20, unit=Unit.MINUTE, full_key="l.small2")  # never leased
    calls = calls_of(await leased())
    leases = await warm(calls, [Check(0, roomy, "lease:roomy2", 1)], 2 * HOT_CALLS)
    (lease,) = leases.leases.values()
    before = lease.left
    server.client().set(f"lease:small2@{NOW // small.window_ms}", 20)
    outcomes = await decide(
        calls, [Check(0, roomy, "lease:roomy2", 3), Check(1, small, "lease:small2", 1)]
    )
    assert [(o.ok, o.charged) for o in outcomes] == [(True, False), (False, False)]
    assert lease.left == before, "the leased hits of a refused request went back to the lease"


async def test_a_lease_running_low_starts_one_refill_however_many_requests_find_it_low(
    server: RedisServer, leased: Callable[[], Awaitable[RedisBackend]],
) -> None:
    limit = Limit(requests_per_unit=100_000, unit=Unit.MINUTE, full_key="l.storm")
    check = Check(0, limit, "lease:storm", 1)
    calls = calls_of(await leased())
    leases = await warm(calls, [check], 2 * HOT_CALLS)
    (lease,) = leases.leases.values()
    # Requests decided back to back without yielding to the loop (a burst read from one
    # socket): the lease falls under its low-water mark once, and only one refill starts.
    decided = 0
    while lease.left > 0:
        assert leases.decide_local([check], NOW) is not None
        decided += 1
    assert decided > 1 and len(leases._background) == 1
    await settled(leases)
    assert lease.left > 0, "the refill landed"


async def test_an_idle_lease_gives_its_unused_tokens_back_to_the_counter(
    server: RedisServer, leased: Callable[[], Awaitable[RedisBackend]],
) -> None:
    limit = Limit(requests_per_unit=10_000, unit=Unit.MINUTE, full_key="l.idle")
    check = Check(0, limit, "lease:idle", 1)
    calls = calls_of(await leased())
    leases = await warm(calls, [check], 100)
    (lease,) = leases.leases.values()
    assert lease.left > 0 and counter(server, check) == 100 + lease.left
    lease.used_at = 0.0  # unused for ages
    leases.sweep()
    await settled(leases)
    assert counter(server, check) == 100, "exactly the hits handed out stay counted"
    assert not leases.leases
    assert leases.counts[RELEASED] > 0


async def test_a_config_change_gives_every_lease_back(
    server: RedisServer, leased: Callable[[], Awaitable[RedisBackend]],
) -> None:
    limit = Limit(requests_per_unit=10_000, unit=Unit.MINUTE, full_key="l.reload")
    check = Check(0, limit, "lease:reload", 1)
    calls = calls_of(await leased())
    leases = await warm(calls, [check], 100)
    assert counter(server, check) > 100  # leased ahead
    calls.config_changed()  # what the limiter does on every reload or xDS push
    await settled(leases)
    assert counter(server, check) == 100
    assert not leases.leases


async def test_draining_gives_every_lease_back(server: RedisServer) -> None:
    server.client().flushall()
    limit = Limit(requests_per_unit=10_000, unit=Unit.MINUTE, full_key="l.drain")
    check = Check(0, limit, "lease:drain", 2)
    backend = await leased_backend(server)
    calls = calls_of(backend)
    for _ in range(50):
        await decide(calls, [check])
    assert counter(server, check) > 100  # leased ahead
    await backend.close()
    assert counter(server, check) == 100


async def test_a_lost_counter_takes_no_give_back_and_the_lease_drops_what_it_held(
    server: RedisServer, leased: Callable[[], Awaitable[RedisBackend]],
) -> None:
    limit = Limit(requests_per_unit=10_000, unit=Unit.MINUTE, full_key="l.lost")
    check = Check(0, limit, "lease:lost", 1)
    calls = calls_of(await leased())
    leases = await warm(calls, [check], 100)
    (lease,) = leases.leases.values()
    held = lease.left
    assert held > 0
    server.client().flushall()  # a restart without persistence, a failover that lost writes
    server.client().set(f"lease:lost@{NOW // limit.window_ms}", 7)  # another process's hits
    lease.used_at = 0.0
    leases.sweep()
    await settled(leases)
    assert counter(server, check) == 7, "room the fresh counter never dealt was not given back"
    # The next refill of a lease whose record vanished drops what it held.
    for _ in range(2 * HOT_CALLS):
        await decide(calls, [check])
    await settled(leases)
    (lease,) = leases.leases.values()
    assert lease.held > 0 and leases.counts[LOST] == 0
    server.client().flushall()
    lease.left = 0  # spent what it held: the next request refills
    await decide(calls, [check])
    assert leases.counts[LOST] == 1
    assert lease.held == lease.grant, "the holder's count restarts from the grant"
    assert counter(server, check) == lease.grant, "nothing given back to the fresh counter"


async def test_cold_keys_and_small_limits_go_to_redis_per_call(
    server: RedisServer, leased: Callable[[], Awaitable[RedisBackend]],
) -> None:
    small = Limit(requests_per_unit=50, unit=Unit.MINUTE, full_key="l.small")
    calls = calls_of(await leased())
    for _ in range(40):
        await decide(calls, [Check(0, small, "lease:small", 1)])
    leases = leases_of(calls)
    assert not leases.leases and leases.counts[DECISIONS] == 0
    roomy = Limit(requests_per_unit=1000, unit=Unit.MINUTE, full_key="l.cold")
    for _ in range(HOT_CALLS - 1):
        await decide(calls, [Check(0, roomy, "lease:cold", 1)])
    assert not leases.leases, "a key decided fewer than HOT_CALLS times is not leased"
