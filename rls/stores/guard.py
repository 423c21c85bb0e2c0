"""How a store call is guarded: under a `Deadline`, judged by the store's `CircuitBreaker`.

Every store call goes through here: the Redis store runs each of its operations (decide,
peek, usage statistics, the frequency counters' scripts) through its `StoreGuard`, and so do
the response cache's stores; the limiter and the quota dealer reach the counter store through
rls.stores.calls.StoreCalls, which applies their deadlines with `within`. So a breaker opens on
the same evidence everywhere, a caller's deadline bounds every call, and a failure is one error
type (`BackendError`; `StoreDown` while the breaker is open).

`within` stops *waiting* at expiry instead of waiting for the cancelled call to unwind: redis-py
may still await after a cancellation (a cluster client closing its nodes' connections after a
failed slot-map refresh, a back-off sleep, a shielded refresh of the map), and none of that may
hold the caller past its deadline. The call is cancelled and finishes on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from rls.stores.base import BackendError, StoreDown
from rls.stores.deadline import OVERLOADED, Deadline

T = TypeVar("T")


class Breaker(Protocol):
    """A `CircuitBreaker`, or the breakers of a Cluster call's masters (`NodeGroup`)."""

    def allow(self) -> bool: ...

    def success(self) -> None: ...

    def failure(self, why: str = "") -> None: ...

    def suspect(self) -> None: ...


# What an exception raised by a store call says about the store: tells `breaker` (evidence or
# suspicion) and returns the message of the BackendError to raise, or None when it is not a
# store failure (it propagates as it is).
Judge = Callable[[Exception, Breaker], "str | None"]


def _observed(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def within(deadline: Deadline, call: Awaitable[T]) -> T:
    """`call`'s result, or TimeoutError as soon as `deadline` expires (`deadline.reason` says
    why); the call is then cancelled and left to unwind without us."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(call)
    waiter: asyncio.Future[None] = loop.create_future()
    handle: asyncio.TimerHandle | None = None

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    def check() -> None:
        nonlocal handle
        when = deadline.check(loop.time())
        handle = None if when is None else loop.call_at(when, check)

    task.add_done_callback(wake)
    deadline.on_expire = wake
    handle = loop.call_at(deadline.first_check(), check)
    try:
        await waiter
    except asyncio.CancelledError:  # our caller was cancelled: so is the call
        task.cancel()
        task.add_done_callback(_observed)
        raise
    finally:
        deadline.done()
        if handle is not None:
            handle.cancel()
    if task.done():
        return task.result()
    task.cancel()
    task.add_done_callback(_observed)
    raise TimeoutError(deadline.reason)


class StoreGuard:
    """One store's breaker and the meaning of its errors, around each of its calls."""

    __slots__ = ("breaker", "judge", "label")

    def __init__(self, breaker: Breaker, judge: Judge, label: str) -> None:
        self.breaker = breaker
        self.judge = judge
        self.label = label  # the head of error messages: "redis", "cache store get"…

    def admit(self, breaker: Breaker | None = None, op: str = "") -> Breaker:
        """The breaker that judges this call, if it lets the call go (else StoreDown)."""
        breaker = self.breaker if breaker is None else breaker
        if not breaker.allow():
            raise StoreDown(f"{self.label}{f' {op}' if op else ''} circuit open", op)
        return breaker

    def failed(
        self, exc: Exception, breaker: Breaker, op: str = "", deadline: Deadline | None = None
    ) -> BaseException:
        """The error to raise for `exc` (TimeoutError stays one: the deadline's `reason`
        says why), the breaker told what it says."""
        if isinstance(exc, TimeoutError):  # before OSError: TimeoutError is one
            if deadline is None or deadline.reason != OVERLOADED:  # never blame our own lag
                breaker.suspect()  # a slow call is a suspicion: the probe decides
            return exc
        why = self.judge(exc, breaker)
        if why is None:
            return exc
        return BackendError(f"{self.label}{f' {op}' if op else ''}: {why}", op)

    async def run(
        self,
        call: Awaitable[T],
        deadline: Deadline | None,
        breaker: Breaker | None = None,
        op: str = "",
        watched: bool = False,
    ) -> T:
        """`call` under `deadline` (None: the call bounds itself; `watched`: the call watches
        `deadline` itself, the Redis wire) and the breaker (default: the store's)."""
        try:
            judge = self.admit(breaker, op)
        except StoreDown:
            if asyncio.iscoroutine(call):
                call.close()
            raise
        try:
            if deadline is None or watched:
                result = await call
            else:
                result = await within(deadline, call)
        except Exception as exc:
            error = self.failed(exc, judge, op, deadline)
            if error is exc:
                raise
            raise error from exc
        judge.success()
        return result
