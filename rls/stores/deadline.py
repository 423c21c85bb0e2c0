"""Honest deadlines: a store call is timed by the store's time, not by our own lag.

A call that waits on Redis also waits on this process: a garbage collection, a long callback or
a CPU-starved event loop delays the moment the reply is read. Counting that time against the
store made every GC pause look like a dead Redis (three such "timeouts" opened the breaker and
the failure mode answered everything, uncounted). Here:

- `LoopLag` ticks every 10 ms and accumulates how late each tick ran: the time the
  loop spent elsewhere, which no awaiting call could use.
- `Deadline` gives a call its budget of *store* time: when the budget is spent on the
  wall clock, the loop's lost time over the same span is handed back and the deadline moves on.
  When the store itself has used the budget, the call expires as `store_slow` — at once when
  the budget is the caller's (its deadline is up), else only once a health probe of the store
  (its own connection) fails: a store that answers the probe is alive, and the call keeps
  waiting for its reply. A call still waiting at the hard cap (`--overload-cap-ms`, or the
  caller's own deadline) names whoever used most of the wait: the store (`store_slow`: a stalled
  store gets the failure mode, never a refusal, even when it answers the probe's PING while
  holding writes) or this process (`overloaded`: its loop was held, it is the bottleneck).

These live with the stores, not the engine, because the lean Redis connection applies them
itself (`stores/redis/wire.py`: one timer per batch of calls instead of a timeout per call).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

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


Probe = Callable[[], Awaitable[bool]]


class Deadline:
    """One store call's budget, its hard cap and, once it expired, why (`reason`).

    The rule is here once; two drivers apply it: `rls.stores.guard.within` (a call awaited
    through redis-py, given up at expiry) and the lean connection's batch timer
    (`stores/redis/wire.py`: one timer handle for all the calls written in one loop turn, no
    Task or timeout per call).

    - The store's time is the wall clock less what the loop lost meanwhile (`LoopLag`).
    - Store time past `budget`: `store_slow` at once, or, with `probe` (our own budget, no
      caller's deadline), only once the probe fails; a reply meanwhile still wins.
    - Wall clock past `cap`: whoever used most of it is named: the store (`store_slow`, the
      failure mode answers; without the caller's deadline only once it used its budget, even
      if a probe found it alive) or this process (`overloaded`, refused).
    """

    __slots__ = (
        "budget",
        "caller",
        "cap",
        "finished",
        "lag",
        "lost_at_start",
        "on_expire",
        "probe",
        "probing",
        "reason",
        "start",
    )

    def __init__(
        self,
        lag: LoopLag,
        budget: float,
        cap: float,
        probe: Probe | None = None,
        caller: bool = False,
        now: float | None = None,
    ) -> None:
        self.lag = lag
        self.budget = budget
        self.cap = cap
        self.probe = probe
        self.caller = caller
        self.start = asyncio.get_running_loop().time() if now is None else now
        self.lost_at_start = lag.lost()
        self.reason: str | None = None
        self.probing = False
        self.finished = False
        self.on_expire: Callable[[], object] | None = None

    def first_check(self) -> float:
        """Loop time of the first look: nothing expires before its budget is spent (a cap
        below the budget only applies from then on)."""
        return self.start + self.budget

    def check(self, now: float) -> float | None:
        """Look at the call at loop time `now`: None once it expired (see `reason`), else the
        loop time to look again."""
        if self.reason is not None or self.finished:
            return None
        elapsed = now - self.start
        lost = self.lag.lost() - self.lost_at_start
        store_time = elapsed - lost
        if elapsed >= self.cap:
            # Whoever used most of the wait is named. A probe that found the store alive does
            # not clear it here: a store may answer PING and still hold our writes (CLIENT
            # PAUSE WRITE, a long script), and a process with its loop free was not the cause.
            store_used = store_time >= lost and (self.caller or store_time >= self.budget)
            self.expire(STORE_SLOW if store_used else OVERLOADED)
            return None
        if store_time < self.budget:
            return min(now + self.budget - store_time, self.start + self.cap)
        if self.probe is None:
            self.expire(STORE_SLOW)
            return None
        if not self.probing:  # the store used its budget: ask it directly, keep waiting
            self.probing = True
            asyncio.ensure_future(self.probe()).add_done_callback(self._probed)
        return self.start + self.cap

    def expire(self, reason: str) -> None:
        if self.reason is None and not self.finished:
            self.reason = reason
            if self.on_expire is not None:
                self.on_expire()

    def _probed(self, future: asyncio.Future[bool]) -> None:
        healthy = not future.cancelled() and future.exception() is None and future.result()
        if not healthy:
            self.expire(STORE_SLOW)

    def done(self) -> None:
        """The call ended: nothing may expire it any more."""
        self.finished = True
        self.on_expire = None
