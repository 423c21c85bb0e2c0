"""What the limiter needs from a counter store: decide a whole request in one atomic step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rls.core.model import Check, Verdict
from rls.core.usage import UsageOp


class BackendError(Exception):
    """The store could not answer (down, slow, out of memory); the failure mode applies."""


class StoreDown(BackendError):
    """The breaker is open: the store was found unhealthy and no call is sent until a probe
    succeeds."""


class Backend(Protocol):
    name: str

    async def decide(
        self,
        checks: Sequence[Check],
        now_ms: int | None = None,
        usage: Sequence[UsageOp] = (),
        usage_ttl_ms: int = 0,
    ) -> Verdict:
        """Evaluate every check, charge per the admission rule, all atomically.

        Each (key, flags) appears at most once: the limiter folds checks that share a counter
        into one before calling (see limiter._merge_same_counter).

        `now_ms` overrides the store's clock (tests, replay); None uses the store's own clock
        (Redis TIME for Redis, so every replica agrees).
        """
        ...

    async def record_usage(
        self, ops: Sequence[UsageOp], ttl_ms: int, now_ms: int | None = None
    ) -> None:
        """Usage statistics of a request that matched no limit (else they ride in decide)."""
        ...

    async def usage_value(self, kind: str, key: str) -> int:
        """A daily counter ("c") or the size of a distinct set ("h")."""
        ...

    async def peek(self, checks: Sequence[Check], now_ms: int | None = None) -> Verdict:
        """Evaluate like decide() but charge nothing (counter queries)."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def healthy(self) -> bool: ...

    def suspect(self) -> None:
        """A call used its whole store budget: check the store's health (no-op in memory)."""
        ...
