"""What the engine, the quota dealer, the frequency counters and the response cache need from a
store: the one contract (`Backend`), the one error type (`BackendError`, `StoreDown` while a
breaker is open)."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Protocol

from rls.core.model import Check, Verdict
from rls.core.usage import UsageOp
from rls.stores.deadline import Deadline


class BackendError(Exception):
    """The store could not answer (down, slow, out of memory); the failure mode applies.

    `op` names the operation for callers that count errors per operation (the response cache's
    errors metric); empty elsewhere."""

    def __init__(self, message: str = "", op: str = "") -> None:
        super().__init__(message)
        self.op = op


class StoreDown(BackendError):
    """The breaker is open: the store was found unhealthy and no call is sent until a probe
    succeeds."""


class Backend(Protocol):
    """A counter store. Callers go through rls.stores.calls.StoreCalls, which owns the policy
    of a call (deadline, probe, error meaning); the store's own breaker admits and judges each
    of its operations."""

    name: str

    async def decide(
        self,
        checks: Sequence[Check],
        now_ms: int | None = None,
        usage: Sequence[UsageOp] = (),
        usage_ttl_ms: int = 0,
        deadline: Deadline | None = None,
    ) -> Verdict:
        """Evaluate every check, charge per the admission rule, all atomically.

        Each (key, flags) appears at most once: the limiter folds checks that share a counter
        into one before calling (see `checks.merge_same_counter`).

        `now_ms` overrides the store's clock (tests, replay); None uses the store's own clock
        (Redis TIME for Redis, so every replica agrees). `deadline`: the call's budget, watched
        by the store; when it expires the call raises TimeoutError and `deadline.reason` says
        why.
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

    def check_health(self) -> Awaitable[bool]:
        """Whether the store answers a probe now (shared by every call that asks meanwhile);
        the deadline of a call without a caller's deadline asks it before giving up."""
        ...
