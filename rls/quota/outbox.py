"""Answers queued for RLQS clients, capped in bytes per stream and over all streams.

gRPC takes an answer only as fast as the client reads (HTTP/2 flow control), so a client that
keeps reporting and never reads would make rls queue answers without end. Instead a stream
whose queue (or all streams' together) is over its cap reads no further report until the
queue falls: the client's own writes are then held back by flow control. A stream whose queue
stays over the cap with nothing taken for `stalled_s` is to be ended (`Stalled`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable

ROOM_POLL_S = 1.0  # a stream waiting for room looks at its own stall this often


class Stalled(Exception):
    """The client has not taken an answer for `stalled_s` while over the cap."""


class OutboxPool:
    """What all streams' outboxes hold together, and the wake-up for streams waiting on it."""

    def __init__(self, cap_bytes: int, observe: Callable[[int], None]) -> None:
        self.cap_bytes = cap_bytes
        self.bytes = 0
        self._observe = observe  # the gauge of queued bytes
        self._room = asyncio.Condition()
        self._waiting = 0
        self._tasks: set[asyncio.Task[None]] = set()

    def add(self, delta: int) -> None:
        self.bytes += delta
        self._observe(delta)
        if delta < 0 and self._waiting:
            task = asyncio.ensure_future(self._notify())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _notify(self) -> None:
        async with self._room:
            self._room.notify_all()

    async def wait(self, timeout: float) -> None:
        """Until some stream's answer is taken (or `timeout`)."""
        self._waiting += 1
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout), self._room:
                    await self._room.wait()
        finally:
            self._waiting -= 1


class Outbox:
    """One stream's answers, oldest first, until gRPC takes them."""

    def __init__(self, pool: OutboxPool, cap_bytes: int, stalled_s: float) -> None:
        self.pool = pool
        self.cap_bytes = cap_bytes
        self.stalled_s = stalled_s
        self.bytes = 0
        self._queue: deque[bytes] = deque()
        self._progress = time.monotonic()  # last answer taken (or the queue began)
        self._ready = asyncio.Event()
        self.closed = False  # nothing more will be put: `next` returns None once empty

    def __bool__(self) -> bool:
        return bool(self._queue)

    def put(self, data: bytes) -> None:
        if not self._queue:
            self._progress = time.monotonic()
        self._queue.append(data)
        self.bytes += len(data)
        self.pool.add(len(data))
        self._ready.set()

    def close(self) -> None:
        self.closed = True
        self._ready.set()

    async def next(self) -> bytes | None:
        """The oldest answer (still queued until `taken`), or None once closed and empty."""
        while not self._queue:
            if self.closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        return self._queue[0]

    def taken(self) -> None:
        data = self._queue.popleft()
        self._progress = time.monotonic()
        self.bytes -= len(data)
        self.pool.add(-len(data))

    def popleft(self) -> bytes:
        """Take the oldest answer without a writer (tests and direct callers)."""
        data = self._queue[0]
        self.taken()
        return data

    def drop(self) -> None:
        """The stream ended: what it did not send is forgotten."""
        self._queue.clear()
        self.pool.add(-self.bytes)
        self.bytes = 0

    def over(self) -> bool:
        return self.bytes > self.cap_bytes or self.pool.bytes > self.pool.cap_bytes

    def stalled(self) -> bool:
        return bool(self._queue) and time.monotonic() - self._progress > self.stalled_s

    def stall_deadline(self) -> float | None:
        """Monotonic time at which the queue, if nothing is taken, counts as stalled."""
        return self._progress + self.stalled_s if self._queue else None

    async def room(self) -> None:
        """Return once this outbox and the pool are under their caps; raise `Stalled` when the
        client stopped taking answers."""
        while self.over():
            if self.stalled():
                raise Stalled(f"answers unread for {self.stalled_s:g} s")
            await self.pool.wait(ROOM_POLL_S)
