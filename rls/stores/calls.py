"""The policy of a call to the counter store, in one place: the limiter and the quota dealer
make every call through a `StoreCalls`.

It owns, for every operation (decide, peek, record_usage, usage_value):
- the deadline: the caller's budget (its gRPC deadline less a margin) or the store budget
  (`--backend-timeout-ms`), measured net of this process's own lag (rls.stores.deadline), with
  the wall-clock cap past which rls itself is overloaded (`--overload-cap-ms`);
- the probe: with no caller's deadline, a store that used the whole budget is asked directly
  (its breaker's health check) before the call is given up, so only a failed probe is evidence
  of a slow store;
- the breaker: no call goes to a store found unhealthy (StoreDown at once), and every failure
  is judged by the store's own breaker: the Redis store runs each of its operations through
  its StoreGuard (rls.stores.guard), which a Cluster narrows to the call's masters;
- the meaning of a failure: `decide` answers (outcomes, "") or (None, why) with why one of
  STORE_DOWN, STORE_ERROR, STORE_SLOW, OVERLOADED, so the failure mode can say what happened.

Leased counters (`--redis-leases`, rls.stores.redis.leases) answer at once too when they
decide a request alone; what they lack is taken by the store's own decide.

The in-process store (MemoryBackend) answers at once: its calls run without a deadline or a
breaker (there is nothing to wait for and nothing to break), and `round_trip` is False so the
limiter keeps no local over-limit cache for it. This is the one place that tells the two apart.
Tracing wraps `decide` (rls.tracing.wiring).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from rls.core.model import Check, Outcome, Verdict
from rls.core.usage import UsageOp
from rls.stores.base import Backend, BackendError, StoreDown
from rls.stores.deadline import OVERLOADED, Deadline, LoopLag
from rls.stores.guard import within
from rls.stores.memory import MemoryBackend
from rls.stores.redis.leases import Leases

T = TypeVar("T")

STORE_DOWN = "store_down"  # the breaker is open
STORE_ERROR = "store_error"  # the store answered with an error, or the connection failed
STORE_SLOW = "store_slow"  # the store used the whole budget

# (checks, now_ms, usage, usage_ttl_ms, budget_s) -> (outcomes, "") or (None, why)
Decide = Callable[
    [Sequence[Check], int | None, Sequence[UsageOp], int, float | None],
    Awaitable[tuple[list[Outcome] | None, str]],
]


def _ignore(_: Exception) -> None:
    pass


class StoreCalls:
    """Every call of one engine to one store, under one policy (module docstring)."""

    def __init__(
        self,
        backend: Backend,
        lag: LoopLag,
        timeout_ms: int,
        overload_cap_ms: int,
        failed: Callable[[Exception], None] = _ignore,
        sent: Callable[[], None] = lambda: None,
    ) -> None:
        self.backend = backend
        self.name = backend.name
        self.lag = lag
        self.timeout_s = max(timeout_ms, 1) / 1000
        self.cap_s = max(overload_cap_ms, 1) / 1000
        self._failed = failed  # every failure, for the caller's metric and log
        self._sent = sent  # every call that goes to a remote store (round trips)
        self._memory = backend if isinstance(backend, MemoryBackend) else None
        # Whether a call goes over the network (a local over-limit cache can save it).
        self.round_trip = self._memory is None
        # `is not None`: an empty memory store is falsy (it has a length).
        self.decide: Decide = (
            self._decide_at_once if self._memory is not None else self._decide_remote
        )
        # Leased counters (--redis-leases): a request they decide alone is answered here, at
        # once, like the memory store's; the rest go to the store, which takes what they lack.
        leases = getattr(backend, "leases", None)
        self._leases: Leases | None = leases if isinstance(leases, Leases) else None

    # -- decide: the decision of one request ------------------------------------------------

    async def _decide_at_once(
        self, checks: Sequence[Check], now_ms: int | None, usage: Sequence[UsageOp],
        usage_ttl_ms: int, budget_s: float | None,
    ) -> tuple[list[Outcome] | None, str]:
        store = self._memory
        assert store is not None
        if usage:
            store.record_usage_now(usage, usage_ttl_ms, now_ms)
        return store.decide_now(checks, now_ms).outcomes, ""

    async def _decide_remote(
        self, checks: Sequence[Check], now_ms: int | None, usage: Sequence[UsageOp],
        usage_ttl_ms: int, budget_s: float | None,
    ) -> tuple[list[Outcome] | None, str]:
        if self._leases is not None and not usage:
            outcomes = self._leases.decide_local(checks, now_ms)
            if outcomes is not None:
                return outcomes, ""
        deadline = self.deadline(budget_s)
        try:
            verdict = await self.verdict(checks, now_ms, usage, usage_ttl_ms, deadline)
        except StoreDown as exc:
            self._failed(exc)
            return None, STORE_DOWN
        except BackendError as exc:
            self._failed(exc)
            return None, STORE_ERROR
        except TimeoutError as exc:
            if deadline.reason == OVERLOADED:
                return None, OVERLOADED
            self._failed(exc if str(exc) else TimeoutError("store slower than the budget"))
            return None, STORE_SLOW
        return verdict.outcomes, ""

    def deadline(self, budget_s: float | None = None) -> Deadline:
        """A decision's deadline: the caller's budget, wall-clock capped at it (an answer past
        it is no answer), or the store budget with a probe before giving up."""
        cap = self.cap_s
        if budget_s is None:
            return Deadline(self.lag, self.timeout_s, cap, self.backend.check_health, False)
        return Deadline(self.lag, budget_s, min(cap, budget_s), None, True)

    async def verdict(
        self, checks: Sequence[Check], now_ms: int | None = None, usage: Sequence[UsageOp] = (),
        usage_ttl_ms: int = 0, deadline: Deadline | None = None,
    ) -> Verdict:
        """The store's verdict under `deadline` (default: the store budget, no probe). Raises
        StoreDown, BackendError, or TimeoutError (`deadline.reason` says why); a call that
        used the store's whole budget makes the breaker suspect the store."""
        if self._memory is not None:
            if usage:
                self._memory.record_usage_now(usage, usage_ttl_ms, now_ms)
            return self._memory.decide_now(checks, now_ms)
        deadline = deadline or self._own()
        self._sent()
        try:
            return await self.backend.decide(checks, now_ms, usage, usage_ttl_ms, deadline)
        except TimeoutError:
            if deadline.reason != OVERLOADED:  # never blame the store for our own lag
                self.backend.suspect()
            raise

    def config_changed(self) -> None:
        """The limits may have changed: leased tokens go back to their counters."""
        if self._leases is not None:
            self._leases.config_changed()

    # -- beside the decision: reads and usage statistics ------------------------------------

    async def peek(self, checks: Sequence[Check], now_ms: int | None = None,
                   budget_s: float | None = None) -> Verdict:
        """Evaluate without charging (counter queries, the other descriptors of a request
        the over-limit cache rejected)."""
        if self._memory is not None:
            return self._memory.decide_now(checks, now_ms, charge=False)
        return await self._guarded(self.backend.peek(checks, now_ms), budget_s)

    async def record_usage(self, ops: Sequence[UsageOp], ttl_ms: int,
                           now_ms: int | None = None) -> None:
        """Usage statistics of a request that matched no limit (else they ride in decide)."""
        if self._memory is not None:
            self._memory.record_usage_now(ops, ttl_ms, now_ms)
            return
        await self._guarded(self.backend.record_usage(ops, ttl_ms, now_ms), None)

    async def usage_value(self, kind: str, key: str) -> int:
        return await self._guarded(self.backend.usage_value(kind, key), None)

    def _own(self, budget_s: float | None = None) -> Deadline:
        budget = self.timeout_s if budget_s is None else budget_s
        return Deadline(self.lag, budget, budget)

    async def _guarded(self, call: Awaitable[T], budget_s: float | None) -> T:
        """A call beside the decision, bounded by the store budget (or `budget_s`), its
        failures counted; the store's breaker admits and judges it as it does a decision
        (StoreDown at once while it is open)."""
        self._sent()
        try:
            return await within(self._own(budget_s), call)
        except (BackendError, TimeoutError) as exc:
            self._failed(exc)
            raise
