"""Several plain fixed-window requests queued in one loop turn go to Redis as one EVALSHA of
lua/decide_fixed_window_batch.lua (rls/stores/redis/scripts.py `LeanBatch`), each still decided
all-or-nothing, in order.

- Differential: a batch decided on Redis answers, request by request, what the memory store
  answers for the same requests one after the other (requests of one batch share counters).
- One EVALSHA per batch (Redis's command statistics), and a Redis that lost its scripts
  (SCRIPT FLUSH) is served by the same batch, sent again alone, then batched again.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from conftest import RedisServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rls.config.model import Limit, Unit
from rls.core.model import Check
from rls.stores.memory import MemoryBackend
from rls.stores.redis import RedisBackend
from rls.stores.redis.scripts import BATCH_MIN_DEPTH

pytestmark = pytest.mark.redis

NOW = 1_700_000_000_000
_RUN = itertools.count()


def evalsha_calls(server: RedisServer) -> int:
    stats = server.client().info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


# A batch: requests of 1-3 checks on distinct counters among 3, each counter with its own limit.
requests = st.lists(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3)), min_size=1, max_size=3,
             unique_by=lambda c: c[0]),
    min_size=BATCH_MIN_DEPTH, max_size=12,
)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(limits=st.tuples(*(st.integers(0, 6) for _ in range(3))), batch=requests)
async def test_a_batch_decides_each_request_as_the_memory_store_does_in_order(
    started: RedisBackend, limits: tuple[int, int, int], batch: list[list[tuple[int, int]]]
) -> None:
    run = next(_RUN)
    caps = [Limit(requests_per_unit=n, unit=Unit.MINUTE, full_key=f"b.k{i}")
            for i, n in enumerate(limits)]

    def checks(request: list[tuple[int, int]]) -> list[Check]:
        return [Check(0, caps[k], f"batch{run}:k{k}", hits) for k, hits in request]

    memory = MemoryBackend(sweep_interval=0)
    expected = [memory.decide_now(checks(r), NOW) for r in batch]
    got = await asyncio.gather(*(started.decide(checks(r), NOW) for r in batch))
    assert got == expected


async def test_requests_of_one_loop_turn_are_one_evalsha(
    started: RedisBackend, server: RedisServer
) -> None:
    cap = Limit(requests_per_unit=25, unit=Unit.HOUR, full_key="b.k")
    await started.decide([Check(0, cap, "warm", 1)])
    before = evalsha_calls(server)
    verdicts = await asyncio.gather(*(started.decide([Check(0, cap, "same", 1)])
                                      for _ in range(40)))
    assert evalsha_calls(server) - before == 1
    assert [v.admitted for v in verdicts] == [True] * 25 + [False] * 15  # in order, exact


async def test_a_batch_meeting_a_flushed_redis_is_sent_again_then_batched_again(
    started: RedisBackend, server: RedisServer
) -> None:
    cap = Limit(requests_per_unit=1000, unit=Unit.HOUR, full_key="b.k")
    await asyncio.gather(*(started.decide([Check(0, cap, "f", 1)]) for _ in range(5)))
    server.client().script_flush()
    verdicts = await asyncio.gather(*(started.decide([Check(0, cap, "f", 1)]) for _ in range(5)))
    assert all(v.admitted for v in verdicts)
    assert [o.remaining for v in verdicts for o in v.outcomes] == list(range(994, 989, -1))
    before = evalsha_calls(server)
    await asyncio.gather(*(started.decide([Check(0, cap, "f", 1)]) for _ in range(5)))
    assert evalsha_calls(server) - before == 1
