"""Circuit breaker driven by evidence about the store, never by our own lag.

Closed: calls go through. The breaker opens only on evidence that the store is unhealthy:
`threshold` consecutive connection-level errors, or a failed probe — a PING on the probe's own
connection, run in a thread with its own socket timeout, so an event loop held up by a GC pause
or CPU contention cannot make a healthy store look dead. A slow call is only a *suspicion*: it
starts a probe (one at a time) and the probe decides.

Open: calls fail at once (the failure mode answers in microseconds instead of a timeout per
call) while a prober pings the store every `probe_interval`; the first successful probe closes
the breaker, so calls go back to the store within about one interval of its return.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("rls.backend")

CLOSED, OPEN = "closed", "open"
HALF_OPEN = "half_open"  # kept for the gauge's value table; the prober replaces half-open calls

Probe = Callable[[], Awaitable[bool]]


async def _always_healthy() -> bool:
    return True


class CircuitBreaker:
    def __init__(
        self,
        name: str,
        threshold: int = 3,
        probe: Probe | None = None,
        probe_interval: float = 0.1,
        on_change: Callable[[str], None] | None = None,
    ) -> None:
        self.name = name
        self.threshold = threshold
        self.probe_interval = probe_interval
        self._probe = probe or _always_healthy
        self._on_change = on_change
        self.state = CLOSED
        self._failures = 0
        self._task: asyncio.Task[None] | None = None  # the prober while open
        self._check: asyncio.Task[bool] | None = None  # a one-off probe while closed
        self.last_error = ""

    def set_probe(self, probe: Probe) -> None:
        self._probe = probe

    def report(self, state: str) -> None:
        """Show `state` to this breaker's watcher (the gauge) without changing this breaker:
        on Cluster, the masters' own breakers summed up (stores/redis/node_breakers.py)."""
        if self._on_change is not None:
            self._on_change(state)

    def allow(self) -> bool:
        """Whether a call may go to the store now."""
        return self.state == CLOSED

    def success(self) -> None:
        self._failures = 0

    def failure(self, why: str = "") -> None:
        """A connection-level error: evidence. `threshold` in a row open the breaker."""
        self._failures += 1
        if why:
            self.last_error = why
        if self._failures >= self.threshold:
            self.open(why)
        else:
            self.suspect()

    def suspect(self) -> None:
        """A call was slow or failed oddly: ask the store directly (one probe at a time)."""
        self.check()

    def check(self) -> asyncio.Future[bool]:
        """The store's health, from the probe in flight or a new one (one at a time); a
        failed probe opens the breaker. An open breaker answers False at once."""
        loop = asyncio.get_running_loop()
        if self.state == OPEN:
            done: asyncio.Future[bool] = loop.create_future()
            done.set_result(False)
            return done
        if self._check is None or self._check.done():
            self._check = loop.create_task(self._check_once())
        return self._check

    def open(self, why: str = "") -> None:
        if self.state != OPEN:
            self._set(OPEN, why)
        if self._task is None:
            self._spawn(self._probe_until_healthy())

    def close(self) -> None:
        self._failures = 0
        if self.state != CLOSED:
            self._set(CLOSED)

    async def stop(self) -> None:
        for task in (self._task, self._check):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._check = None

    def _spawn(self, coro: Awaitable[None]) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (sync tests): nothing to probe with
            return
        task: asyncio.Task[None] = loop.create_task(coro)  # type: ignore[arg-type]
        self._task = task
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        if self._task is task:
            self._task = None

    async def _healthy(self) -> bool:
        try:
            return await self._probe()
        except Exception as exc:  # a probe that raises is a failed probe
            self.last_error = str(exc) or type(exc).__name__
            return False

    async def _check_once(self) -> bool:
        if await self._healthy():
            return True
        self.open(self.last_error or "probe failed")
        return False

    async def _probe_until_healthy(self) -> None:
        while True:
            if await self._healthy():
                self.close()
                return
            await asyncio.sleep(self.probe_interval)

    def _set(self, state: str, why: str = "") -> None:
        log.warning(
            "backend %s circuit %s -> %s%s", self.name, self.state, state, f": {why}" if why else ""
        )
        self.state = state
        if self._on_change is not None:
            self._on_change(state)

