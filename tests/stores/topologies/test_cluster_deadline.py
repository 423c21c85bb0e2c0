"""Issue 33: a Cluster call answers by its caller's deadline whatever redis-py does after the
cancellation.

A master SIGKILLed under callers sending 0.5 s deadlines cost a few calls a whole second
(DEADLINE_EXCEEDED): a call cancelled at its deadline while redis-py's cluster client read the
slot map again waited for redis-py to unwind, and `RedisCluster.initialize` catches the
cancellation to close every node's connections (twice) before passing it on. The caller now
stops waiting at its deadline; the call unwinds without it (`rls.stores.guard.within`).

The cluster, the client and the store are real; the two steps that take long in a failover (a
CLUSTER SLOTS asked of a node that no longer answers, closing the nodes' connections) are
stretched so that the test does not depend on a failover's timing."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from rls.config.model import Limit, Unit
from rls.core.model import Check
from rls.stores.deadline import STORE_SLOW, Deadline, LoopLag
from rls.stores.redis import RedisBackend

from .servers import ClusterTopology

pytestmark = pytest.mark.redis

CALLER_DEADLINE_S = 0.3
SLACK_S = 0.15
UNWIND_S = 1.0  # each of redis-py's two closes after a cancelled slot-map refresh


async def test_a_call_answers_by_its_deadline_while_redis_py_unwinds_a_slot_map_refresh(
    cluster: ClusterTopology, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = RedisBackend(cluster.url, timeout_ms=1000)
    await backend.start()
    client: Any = backend.client
    manager = client.nodes_manager
    closes: list[float] = []
    unwound = asyncio.Event()

    async def refresh_never_answers(*_: Any, **__: Any) -> None:
        await asyncio.sleep(30)  # CLUSTER SLOTS asked of a node that no longer answers

    async def slow_close(*_: Any, **__: Any) -> None:
        await asyncio.sleep(UNWIND_S)  # closing every node's connections
        closes.append(time.monotonic())
        if len(closes) == 2:
            unwound.set()

    nodes_manager = type(manager)  # slotted: its methods are stretched on the class
    monkeypatch.setattr(nodes_manager, "initialize", refresh_never_answers)
    monkeypatch.setattr(nodes_manager, "aclose", slow_close)
    client._initialize = True  # a failed call asked for the slot map again
    try:
        deadline = Deadline(LoopLag(), CALLER_DEADLINE_S, CALLER_DEADLINE_S, caller=True)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await backend.decide([Check(0, Limit(5, Unit.MINUTE), "issue-33", 1)],
                                 deadline=deadline)
        took = time.monotonic() - started
        assert deadline.reason == STORE_SLOW  # the store's fault: the failure mode answers
        assert took <= CALLER_DEADLINE_S + SLACK_S, f"answered after {took:.3f}s"
        await asyncio.wait_for(unwound.wait(), timeout=10 * UNWIND_S)  # it still unwinds
        assert closes[0] - started >= CALLER_DEADLINE_S + UNWIND_S * 0.9
    finally:
        monkeypatch.undo()
        client._initialize = False
        await backend.close()
