"""StoreCalls (rls/stores/calls.py): the memory store is called at once, without a deadline,
whatever it holds (an empty store is falsy: it has a length, and a truthiness test once sent
every memory decision down the remote path, a Deadline per call)."""

from __future__ import annotations

import pytest

from rls.config.model import Limit, Unit
from rls.core.model import Check
from rls.stores.calls import StoreCalls
from rls.stores.deadline import Deadline, LoopLag
from rls.stores.memory import MemoryBackend

pytestmark = pytest.mark.unit


async def test_an_empty_memory_store_is_decided_at_once_without_a_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryBackend(sweep_interval=0)
    assert len(store) == 0
    calls = StoreCalls(store, LoopLag(), 50, 1000)
    made = []
    monkeypatch.setattr(Deadline, "__init__", lambda self, *a, **k: made.append(a))
    limit = Limit(requests_per_unit=5, unit=Unit.MINUTE, full_key="c.k")
    outcomes, why = await calls.decide([Check(0, limit, "calls:k", 1)], 1_000, (), 0, 0.02)
    assert why == "" and outcomes is not None and outcomes[0].ok
    assert made == [], "a memory decision made a Deadline"
    assert calls.round_trip is False
