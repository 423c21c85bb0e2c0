"""Honest deadlines: a store call is timed by the store's time, not by our own lag.

A call that waits on Redis also waits on this process: a garbage collection, a long callback or
a CPU-starved event loop delays the moment the reply is read. Counting that time against the
store made every GC pause look like a dead Redis (three such "timeouts" opened the breaker and
the failure mode answered everything, uncounted). Here:

- `LoopLag` ticks every 10 ms and accumulates how late each tick ran: the time the
  loop spent elsewhere, which no awaiting call could use.
- `store_deadline` gives a call its budget of *store* time: when the budget is spent on the
  wall clock, the loop's lost time over the same span is handed back and the deadline moves on.
  When the store itself has used the budget, the call expires as `store_slow` — at once when
  the budget is the caller's (its deadline is up), else only once a health probe of the store
  (its own connection) fails: a store that answers the probe is alive, and the call keeps
  waiting for its reply. A call that keeps waiting because this process is overloaded expires
  at the hard cap as `overloaded`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

STORE_SLOW = "store_slow"
OVERLOADED = "overloaded"


class LoopLag:
    """Time the event loop was late for a periodic tick, summed (seconds)."""

    def __init__(
        self, interval: float = 0.01, observe: Callable[[float], None] | None = None
    ) -> None:
        self.interval = interval
        self._observe = observe
        self._lost = 0.0
        self._expected = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        if self._handle is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._expected = self._loop.time() + self.interval
        self._handle = self._loop.call_at(self._expected, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    @property
    def running(self) -> bool:
        return self._handle is not None

    def _tick(self) -> None:
        assert self._loop is not None
        now = self._loop.time()
        late = now - self._expected
        if late > 0:
            self._lost += late
            if self._observe is not None:
                self._observe(late)
        self._expected = now + self.interval
        self._handle = self._loop.call_at(self._expected, self._tick)

    def lost(self) -> float:
        """Lost time so far, including a tick that is overdue right now."""
        if self._loop is None or self._handle is None:
            return self._lost
        overdue = self._loop.time() - self._expected
        return self._lost + overdue if overdue > 0 else self._lost


class StoreDeadline:
    """Result of one guarded call: why it expired, if it did."""

    __slots__ = ("reason",)

    def __init__(self) -> None:
        self.reason: str | None = None


@contextlib.asynccontextmanager
async def store_deadline(
    budget: float,
    lag: LoopLag,
    cap: float,
    probe: Callable[[], Awaitable[bool]] | None = None,
) -> AsyncIterator[StoreDeadline]:
    """Raise TimeoutError when the store has used `budget` seconds (and, with `probe`, the
    store then failed a health probe), or the wall clock reached `cap`.

    `deadline.reason` says which (`store_slow` / `overloaded`) once TimeoutError is raised.
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    lost_at_start = lag.lost()
    result = StoreDeadline()
    finished = False
    handle: asyncio.TimerHandle | None = None
    async with asyncio.timeout(None) as timeout:

        def expire(reason: str) -> None:
            if result.reason is None and not finished:
                result.reason = reason
                timeout.reschedule(loop.time())  # expire on the next loop turn

        def probed(future: asyncio.Future[bool]) -> None:
            healthy = not future.cancelled() and future.exception() is None and future.result()
            if not healthy:
                expire(STORE_SLOW)

        def check() -> None:
            nonlocal handle
            now = loop.time()
            elapsed = now - start
            store_time = elapsed - (lag.lost() - lost_at_start)
            if elapsed >= cap:
                expire(OVERLOADED if store_time < budget or probe is not None else STORE_SLOW)
            elif store_time < budget:
                handle = loop.call_at(min(now + budget - store_time, start + cap), check)
            elif probe is None:
                expire(STORE_SLOW)
            else:
                # The store used its budget: ask it directly; meanwhile the call keeps waiting
                # (a reply still wins), and the cap still applies.
                asyncio.ensure_future(probe()).add_done_callback(probed)
                handle = loop.call_at(start + cap, check)

        handle = loop.call_at(start + budget, check)
        try:
            yield result
        finally:
            finished = True
            handle.cancel()  # the one scheduled last
