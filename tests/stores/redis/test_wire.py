"""The decisions' lean Redis connection (rls/stores/redis/wire.py), on a real redis-server.

Pins what the wire promises: everything queued in one loop turn is one write; replies reach
their own callers in order, also after earlier callers gave up on their deadline; a store that
drops the connection fails the calls in flight at once (breaker evidence) and the wire reopens
by itself; a restarted Redis (no scripts) is served after one NOSCRIPT; one `Deadline` timer
serves a whole batch, and the wire is closed with the store.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis as redis_py
from conftest import RedisServer, start_redis

from rls.config.model import Limit, Unit
from rls.core.model import Check
from rls.stores.base import BackendError
from rls.stores.breaker import CircuitBreaker
from rls.stores.deadline import STORE_SLOW, Deadline, LoopLag
from rls.stores.redis import RedisBackend
from rls.stores.redis import wire as wire_module

pytestmark = pytest.mark.redis

LIMIT = Limit(requests_per_unit=1000, unit=Unit.HOUR, full_key="d.k")


def check(key: str, hits: int = 1) -> Check:
    return Check(0, LIMIT, key, hits)


def wire_of(started: RedisBackend) -> Any:
    assert started.topology.wire is not None
    return started.topology.wire


async def test_calls_queued_in_one_loop_turn_go_out_in_one_write(started: RedisBackend) -> None:
    await started.decide([check("warm")])
    wire = wire_of(started)
    transport = wire._proto.transport
    writes: list[int] = []
    original = transport.write

    def counting(data: bytes) -> None:
        writes.append(len(data))
        original(data)

    transport.write = counting
    try:
        verdicts = await asyncio.gather(*(started.decide([check(f"k{i}")]) for i in range(50)))
    finally:
        transport.write = original
    assert all(v.admitted for v in verdicts)
    assert len(writes) == 1, writes


async def test_replies_reach_their_own_callers_after_earlier_callers_gave_up(
    started: RedisBackend, server: RedisServer
) -> None:
    """Calls whose deadline passed while Redis was paused leave the queue in order: the calls
    after them get their own counters, not a neighbour's reply."""
    for i in range(10):
        await started.decide([check(f"own{i}", hits=i + 1)])  # counter own<i> holds i + 1
    lag = LoopLag()
    pauser = redis_py.Redis(port=server.port)
    await asyncio.to_thread(pauser.execute_command, "CLIENT", "PAUSE", "1000", "ALL")
    expired = [
        asyncio.ensure_future(
            started.decide([check(f"gone{i}")], deadline=Deadline(lag, 0.05, 0.05))
        )
        for i in range(20)
    ]
    results = await asyncio.gather(*expired, return_exceptions=True)
    assert all(isinstance(r, TimeoutError) for r in results), results
    # Redis resumes and answers the expired calls first; these must still get their own.
    verdicts = await asyncio.gather(
        *(started.peek([check(f"own{i}", hits=0)]) for i in range(10))
    )
    assert [v.outcomes[0].used for v in verdicts] == [i + 1 for i in range(10)]
    pauser.close()


async def test_an_expired_call_names_the_store_and_its_reply_is_dropped(
    started: RedisBackend, server: RedisServer
) -> None:
    lag = LoopLag()
    pauser = redis_py.Redis(port=server.port)
    await asyncio.to_thread(pauser.execute_command, "CLIENT", "PAUSE", "200", "ALL")
    deadline = Deadline(lag, 0.03, 0.03, caller=True)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        await started.decide([check("late")], deadline=deadline)
    assert deadline.reason == STORE_SLOW
    assert time.monotonic() - t0 < 0.15  # bounded by the deadline, not by Redis
    pauser.close()


async def test_a_dropped_connection_fails_calls_at_once_and_the_wire_reopens(
    started: RedisBackend, server: RedisServer
) -> None:
    await started.decide([check("before")])
    killer = redis_py.Redis(port=server.port)
    name = "rls-killer"
    killer.client_setname(name)
    killed = await asyncio.to_thread(
        killer.execute_command, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"
    )
    assert killed >= 1
    failures = 0
    deadline = time.monotonic() + 5
    while True:
        try:
            verdict = await started.decide([check("after")])
            break
        except BackendError:
            failures += 1
            assert time.monotonic() < deadline, "the wire did not reopen"
            await asyncio.sleep(0.01)
    assert verdict.admitted
    assert wire_of(started).connected
    killer.close()


async def test_a_flushed_script_is_loaded_again_on_the_wire(
    started: RedisBackend, server: RedisServer
) -> None:
    await started.decide([check("x")])
    server.client().script_flush()
    verdicts = await asyncio.gather(*(started.decide([check("x")]) for _ in range(5)))
    assert all(v.admitted for v in verdicts)
    assert int(server.client().get(next(iter(server.client().keys("x*")))) or 0) == 6


async def test_a_store_nobody_started_opens_its_wire_on_the_first_call(
    server: RedisServer,
) -> None:
    server.client().flushall()
    b = RedisBackend(server.url)
    try:
        verdicts = await asyncio.gather(*(b.decide([check(f"lazy{i}")]) for i in range(10)))
        assert all(v.admitted for v in verdicts)
        clients = server.client().client_list()
        # one wire (plus redis-py's own pool for script loads and pings), not one per call
        assert len(clients) < 10, clients
    finally:
        await b.close()
    assert not wire_of(b).connected


async def test_a_unix_socket_store_decides_on_the_wire(tmp_path) -> None:
    sock = tmp_path / "redis.sock"
    server = start_redis("--unixsocket", str(sock))
    store = RedisBackend(f"unix://{sock}")
    try:
        await store.start()
        cap = Limit(requests_per_unit=3, unit=Unit.HOUR, full_key="d.k")
        verdicts = await asyncio.gather(*(store.decide([Check(0, cap, "u", 1)]) for _ in range(5)))
        assert [v.admitted for v in verdicts] == [True, True, True, False, False]
        assert wire_of(store).connected
    finally:
        await store.close()
        server.stop()


async def test_a_probe_that_finds_redis_back_reopens_the_wire_before_closing_the_breaker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Redis restarted after an outage: the breaker's probe must not let calls through while
    the wire still sleeps in its reconnect back-off (they failed with "reconnecting" and the
    breaker flapped). The back-off cap is raised to make that window wide."""
    monkeypatch.setattr(wire_module, "MAX_BACKOFF_S", 1.0)
    server = start_redis()
    store = RedisBackend(server.url, breaker=CircuitBreaker("redis", probe_interval=0.05),
                         probe_timeout_ms=200)
    try:
        await store.start()
        assert (await store.decide([check("before")])).admitted
        await asyncio.to_thread(server.stop)  # the wire loses its connection and reconnects
        await asyncio.sleep(1.7)  # the wire's back-off has reached its cap (1 s)
        assert not wire_of(store).connected
        server = await asyncio.to_thread(start_redis, port=server.port)
        assert await store.probe()  # what the breaker asks before it closes
        assert wire_of(store).connected
        assert (await store.decide([check("after")])).admitted
    finally:
        await store.close()
        server.stop()
