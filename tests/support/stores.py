"""A counter store behind a round trip, for tests: the memory store seen through a wrapper.

rls.stores.calls.StoreCalls calls the memory store directly (it cannot fail or be slow); a
test that needs a store which fails, races another process or answers late subclasses
RemoteStore and overrides `decide`: every call then goes the way a Redis call goes (deadline,
failure mode), and the inner memory store still keeps the counts.
"""

from __future__ import annotations

from typing import Any

from rls.stores.memory import MemoryBackend


class RemoteStore:
    """Every attribute of an inner MemoryBackend, but not one itself (so not in-process)."""

    name = "remote"

    def __init__(self, **memory_options: Any) -> None:
        self.inner = MemoryBackend(**memory_options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def decide(self, checks: Any, now_ms: Any = None, usage: Any = (),
                     usage_ttl_ms: int = 0, deadline: Any = None) -> Any:
        return await self.inner.decide(checks, now_ms, usage, usage_ttl_ms, deadline)
