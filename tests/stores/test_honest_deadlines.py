"""Our own lag is not the store's failure; the store's failure is seen and forgiven quickly.

In-process limiter on a real redis-server (started with DEBUG enabled, so it can be frozen):
- a loop stall (what a GC pause or a busy neighbour does to us) longer than the whole budget,
  while calls wait on a healthy Redis: every call is decided by the store and the breaker stays
  closed;
- a stall past the hard cap: the call is refused as overloaded (UNAVAILABLE for the caller),
  never answered by the failure mode;
- a Redis that really is slow: calls answer by the failure mode as `store_slow`, the probe opens
  the breaker, and the first successful probe closes it within 250 ms of Redis answering again;
- the caller's deadline sets the budget when it sends one.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
import redis as redis_py
from conftest import RedisServer, http_get, start_redis
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from rls.config.loader import load_files
from rls.engine.limiter import OK, OVER_LIMIT, DescriptorIn, Overloaded, RateLimiter
from rls.observability.metrics import Metrics
from rls.settings import Settings
from rls.stores.breaker import CLOSED, OPEN, CircuitBreaker
from rls.stores.deadline import LoopLag
from rls.stores.redis import RedisBackend

pytestmark = pytest.mark.slow

CONFIG = """
domain: d
descriptors:
  - key: k
    rate_limit: {unit: day, requests_per_unit: 1000}
"""


@pytest.fixture(scope="module")
def debug_redis() -> Iterator[RedisServer]:
    server = start_redis("--enable-debug-command", "yes")
    yield server
    server.stop()


class Rig:
    def __init__(self, url: str, tmp_path, **settings: object) -> None:
        config = load_files([("d.yaml", CONFIG)])
        self.settings = Settings(**settings)  # type: ignore[arg-type]
        self.metrics = Metrics()
        self.breaker = CircuitBreaker("redis", probe_interval=0.05)
        self.backend = RedisBackend(url, breaker=self.breaker, probe_timeout_ms=100)
        self.lag = LoopLag()
        self.limiter = RateLimiter(
            lambda: config, self.backend, self.settings, self.metrics, self.lag
        )

    async def call(self, value: str = "v", budget_s: float | None = None):
        return await self.limiter.should_rate_limit(
            "d", [DescriptorIn((("k", value),))], budget_s=budget_s
        )

    def failure_answers(self, reason: str) -> float:
        total = 0.0
        for answer in ("allow", "deny", "fallback", "unavailable"):
            value = self.metrics.registry.get_sample_value(
                "rls_failure_mode_answers_total", {"domain": "d", "reason": reason,
                                                   "answer": answer}
            )
            total += value or 0.0
        return total


@pytest.fixture
async def rig(debug_redis: RedisServer, tmp_path) -> AsyncIterator[Rig]:
    debug_redis.client().flushall()
    rig = Rig(debug_redis.url, tmp_path, backend_timeout_ms=15)
    await rig.backend.start()
    rig.lag.start()
    yield rig
    rig.lag.stop()
    await rig.backend.close()


def decided(decision) -> bool:
    return decision.statuses[0].limit is not None


async def stall_loop(seconds: float) -> None:
    """Hold the event loop like a garbage collection does: nothing else runs meanwhile."""
    await asyncio.sleep(0)
    time.sleep(seconds)


async def test_a_loop_stall_longer_than_the_budget_is_not_a_store_failure(rig: Rig) -> None:
    for _ in range(5):
        calls = [asyncio.create_task(rig.call(f"v{i}")) for i in range(20)]
        await asyncio.sleep(0)  # the calls are on the wire now
        await stall_loop(0.06)  # 4x the 15 ms budget
        results = await asyncio.gather(*calls)
        assert all(decided(r) and r.overall == OK for r in results)
    assert rig.breaker.state == CLOSED
    assert rig.failure_answers("store_slow") == rig.failure_answers("store_down") == 0


async def test_a_stall_past_the_overload_cap_is_refused_not_failed_open(
    debug_redis: RedisServer, tmp_path
) -> None:
    debug_redis.client().flushall()
    rig = Rig(debug_redis.url, tmp_path, backend_timeout_ms=15, overload_cap_ms=20)
    await rig.backend.start()
    rig.lag.start()
    sleeper = threading.Thread(
        target=lambda: redis_py.Redis(port=debug_redis.port).execute_command(
            "DEBUG", "SLEEP", "0.3"
        )
    )
    try:
        sleeper.start()
        await asyncio.sleep(0.02)
        # The loop is held for the whole wait, so the store's share of it cannot be told:
        # past the cap the call is refused (UNAVAILABLE), never failed open. (A reply that did
        # arrive meanwhile would still be used: see the test above.)
        call = asyncio.create_task(rig.call())
        await asyncio.sleep(0)
        await stall_loop(0.1)
        with pytest.raises(Overloaded):
            await call
        assert rig.failure_answers("overloaded") == 1
        assert rig.failure_answers("store_slow") == 0
        assert rig.breaker.state == CLOSED
    finally:
        await asyncio.to_thread(sleeper.join)
        rig.lag.stop()
        await rig.backend.close()


async def test_a_slow_store_fails_over_then_closes_within_250ms_of_its_return(
    rig: Rig, debug_redis: RedisServer
) -> None:
    assert decided(await rig.call())
    returned_at: list[float] = []

    def freeze() -> None:
        redis_py.Redis(port=debug_redis.port).execute_command("DEBUG", "SLEEP", "0.5")
        returned_at.append(time.monotonic())

    sleeper = threading.Thread(target=freeze)
    sleeper.start()
    await asyncio.sleep(0.05)
    slow = await rig.call("slow")
    assert slow.overall == OK and not decided(slow)  # failure mode allow answered
    assert rig.failure_answers("store_slow") == 1
    # The probe (its own connection, 100 ms timeout) finds Redis unresponsive: open.
    deadline = time.monotonic() + 2
    while rig.breaker.state != OPEN and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    assert rig.breaker.state == OPEN
    down = await rig.call("down")
    assert not decided(down) and rig.failure_answers("store_down") == 1
    while rig.breaker.state == OPEN and time.monotonic() < deadline + 2:
        await asyncio.sleep(0.005)
    closed_at = time.monotonic()
    await asyncio.to_thread(sleeper.join)
    assert rig.breaker.state == CLOSED
    assert closed_at - returned_at[0] <= 0.25, closed_at - returned_at[0]
    assert decided(await rig.call("after"))


async def test_the_callers_deadline_sets_the_budget(rig: Rig, debug_redis: RedisServer) -> None:
    sleeper = threading.Thread(
        target=lambda: redis_py.Redis(port=debug_redis.port).execute_command(
            "DEBUG", "SLEEP", "0.05"
        )
    )
    sleeper.start()
    await asyncio.sleep(0.01)
    # 15 ms of our own budget would fail this call; the caller says it can wait 400 ms.
    result = await rig.call("patient", budget_s=0.4)
    await asyncio.to_thread(sleeper.join)
    assert decided(result)
    assert rig.failure_answers("store_slow") == 0


async def test_deny_mode_marks_limited_descriptors_over_limit(
    debug_redis: RedisServer, tmp_path
) -> None:
    rig = Rig(f"redis://127.0.0.1:{debug_redis.port + 1}/0", tmp_path, failure_mode="deny")
    rig.breaker.open("test: store down")
    try:
        decision = await rig.call()
        assert decision.overall == OVER_LIMIT
        assert decision.statuses[0].code == OVER_LIMIT
        assert rig.failure_answers("store_down") == 1
    finally:
        await rig.breaker.stop()
        await rig.backend.close()


async def test_an_overloaded_process_says_so_instead_of_answering_ok(
    rls_factory, debug_redis: RedisServer, tmp_path
) -> None:
    """Past --max-inflight a call is refused with RESOURCE_EXHAUSTED (Envoy's own failure mode
    then decides), counted as answered by `resource_exhausted`, never a silent OK."""
    debug_redis.client().flushall()
    path = tmp_path / "d.yaml"
    path.write_text(CONFIG)
    rls = rls_factory(path, args=("--redis-url", debug_redis.url, "--max-inflight", "1",
                                  "--backend-timeout-ms", "3000"))
    entry = ratelimit_pb2.RateLimitDescriptor.Entry
    request = rls_pb2.RateLimitRequest(
        domain="d", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry(key="k",
                                                                                  value="v")])]
    )
    sleeper = threading.Thread(
        target=lambda: redis_py.Redis(port=debug_redis.port).execute_command(
            "DEBUG", "SLEEP", "0.5"
        )
    )
    async with grpc.aio.insecure_channel(rls.grpc_addr) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        await stub.ShouldRateLimit(request)  # connected and warm
        sleeper.start()
        await asyncio.sleep(0.05)
        first = asyncio.ensure_future(stub.ShouldRateLimit(request))  # waits on the frozen store
        await asyncio.sleep(0.1)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ShouldRateLimit(request)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        response = await first
        await asyncio.to_thread(sleeper.join)
    assert response.statuses[0].HasField("current_limit")  # the waiting call was decided
    _, body = http_get(rls.http_url + "/metrics")
    text = body.decode()
    assert ('rls_failure_mode_answers_total{answer="resource_exhausted",domain="d",'
            'reason="overloaded"} 1.0') in text


async def test_a_store_that_stalls_past_the_callers_deadline_gets_the_failure_mode(
    debug_redis: RedisServer, tmp_path
) -> None:
    """Envoy always sends a deadline: a store frozen for longer than it is the store's failure
    (the domain's failure mode answers, `store_slow`), never a refusal as `overloaded` (which
    would leave the answer to Envoy's own failure_mode_deny and let a `deny` domain through)."""
    debug_redis.client().flushall()
    rig = Rig(debug_redis.url, tmp_path, failure_mode="deny")
    await rig.backend.start()
    rig.lag.start()
    assert decided(await rig.call("warm", budget_s=0.3))
    sleeper = threading.Thread(
        target=lambda: redis_py.Redis(port=debug_redis.port).execute_command(
            "CLIENT", "PAUSE", "700", "ALL"
        )
    )
    try:
        sleeper.start()
        await asyncio.to_thread(sleeper.join)
        started = time.monotonic()
        decision = await rig.call("stalled", budget_s=0.3)
        took = time.monotonic() - started
        assert decision.overall == OVER_LIMIT and not decided(decision)  # deny mode answered
        assert rig.failure_answers("store_slow") == 1
        assert rig.failure_answers("overloaded") == 0
        assert took < 0.6, took  # within the caller's deadline (failure handling bound)
    finally:
        rig.lag.stop()
        await rig.backend.close()


async def test_a_store_that_holds_writes_but_answers_ping_gets_the_failure_mode(
    debug_redis: RedisServer, tmp_path
) -> None:
    """Without a caller's deadline the probe clears a store that answers PING; one that holds
    writes meanwhile (CLIENT PAUSE WRITE: EVALSHA waits, PING answers) still used the whole
    wait itself, so at the hard cap it is named (`store_slow`, the failure mode answers), not
    this process (`overloaded`, refused as if rls were the bottleneck)."""
    debug_redis.client().flushall()
    rig = Rig(debug_redis.url, tmp_path, backend_timeout_ms=15, overload_cap_ms=200)
    await rig.backend.start()
    rig.lag.start()
    assert decided(await rig.call("warm"))
    try:
        debug_redis.client().execute_command("CLIENT", "PAUSE", "700", "WRITE")
        decision = await rig.call("held")
        assert not decided(decision) and decision.overall == OK  # the failure mode (allow)
        assert rig.failure_answers("store_slow") == 1
        assert rig.failure_answers("overloaded") == 0
    finally:
        debug_redis.client().execute_command("CLIENT", "UNPAUSE")
        rig.lag.stop()
        await rig.backend.close()
