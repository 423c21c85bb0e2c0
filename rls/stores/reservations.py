"""Where `reserve:` reservations live (docs/token-budgets.md): the memory store's process, or
Redis beside the counters, so that any rls replica can settle what another one reserved.

A reservation is a record per (counter key, request id): open with the estimate it charged and
the end of the window it charged it in, or settled. Taking it for a settle is one atomic step
(the memory store: one event-loop turn without an await; Redis: one script), so two settles of
one reservation can never both apply: the second finds it settled. A settle that finds nothing
leaves a settled record too (when the bound has room), so a repeated stream-done call charges
its cost once.

Every record is dropped at its expiry (`expire_after` from the moment it opened): an open one
then counts as expired, its estimate stays charged. The sweep runs on every call and every few
seconds from the limiter (`sweep`), so no reservation stays open past its expiry by more than
that interval, and the open count and byte gauges follow.

Bounded in bytes (RECORD_BYTES plus the member's length per record, open or settled): a
reservation that would take the records past the bound is not recorded. Its request is still
admitted with its estimate charged (the bound never refuses traffic); its settle then finds no
reservation and charges the actual cost on top: the counter over-counts that request, it never
undercounts (the budget cannot be overshot by it). Counted as `unrecorded`.
"""

from __future__ import annotations

import hashlib
import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol

from rls.stores.base import Backend
from rls.stores.deadline import Deadline, LoopLag

OPEN, SETTLED, NONE = "open", "settled", "none"
# Estimated bytes of one record besides its member: the dict slot, the state list and its
# ints, the heap entry (CPython 3.11); Redis's hash field and sorted-set entry are of the same
# order. An estimate for the bound, like the memory store's ENTRY_BYTES.
RECORD_BYTES = 200
SWEEP_BATCH = 256  # records one call drops at most (a Redis script stays short)
MAX_ID_CHARS = 128  # a longer request id is kept as its digest (the member stays small)
SCRIPT_FILE = "reservations.lua"


@dataclass(slots=True, frozen=True)
class Opening:
    """A reservation to record: `member` (see `member`), the estimate charged, the end of the
    window it was charged in (0: unknown), how long it waits for its settle."""

    member: str
    estimate: int
    window_end_ms: int
    expire_ms: int


@dataclass(slots=True, frozen=True)
class Found:
    """What a settle found: OPEN (now taken: settled), SETTLED (an earlier settle took it, or
    an earlier settle found nothing) or NONE."""

    state: str
    estimate: int = 0
    window_end_ms: int = 0


def member(counter_key: str, request_id: str) -> str:
    """The record's name: counter key and request id (a long id by its digest)."""
    if len(request_id) > MAX_ID_CHARS:
        request_id = "#" + hashlib.sha256(request_id.encode()).hexdigest()
    return f"{counter_key}\x1f{request_id}"


class ReservationStore(Protocol):
    """The reservations of one store. `open_count` and `nbytes` are as of the last call."""

    name: str
    open_count: int
    nbytes: int

    async def open(self, openings: Sequence[Opening], now_ms: int | None = None) -> list[bool]:
        """Record each reservation; False where it was not (at the bound, or already there)."""
        ...

    async def settle(
        self, members: Sequence[tuple[str, int]], now_ms: int | None = None
    ) -> list[Found]:
        """Take each (member, expire ms) for its settle: what was there, now settled."""
        ...

    async def sweep(self, now_ms: int | None = None) -> None:
        """Drop expired records (open ones count as expired)."""
        ...


class MemoryReservations:
    """Reservations in this process (with the memory store: one process, one event loop)."""

    name = "memory"

    def __init__(
        self,
        max_bytes: int,
        on_expired: Callable[[int], None] = lambda _n: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.max_bytes = max_bytes
        self._on_expired = on_expired
        self._clock = clock
        # member -> [state "o"/"s", estimate, window end ms, expiry ms]
        self._data: dict[str, list[Any]] = {}
        self._expiries: list[tuple[int, str]] = []  # heap of (expiry ms, member)
        self.open_count = 0
        self.nbytes = 0

    def _now(self, now_ms: int | None) -> int:
        return int(self._clock() * 1000) if now_ms is None else now_ms

    async def open(self, openings: Sequence[Opening], now_ms: int | None = None) -> list[bool]:
        now = self._now(now_ms)
        self.sweep_now(now)
        data = self._data
        out = []
        for o in openings:
            size = RECORD_BYTES + len(o.member)
            if self.nbytes + size > self.max_bytes or o.member in data:
                out.append(False)
                continue
            expiry = now + o.expire_ms
            data[o.member] = ["o", o.estimate, o.window_end_ms, expiry]
            heapq.heappush(self._expiries, (expiry, o.member))
            self.nbytes += size
            self.open_count += 1
            out.append(True)
        return out

    async def settle(
        self, members: Sequence[tuple[str, int]], now_ms: int | None = None
    ) -> list[Found]:
        now = self._now(now_ms)
        self.sweep_now(now)
        data = self._data
        out = []
        for name, expire_ms in members:
            record = data.get(name)
            if record is None:
                size = RECORD_BYTES + len(name)
                if self.nbytes + size <= self.max_bytes:  # a tombstone: a repeat is a no-op
                    data[name] = ["s", 0, 0, now + expire_ms]
                    heapq.heappush(self._expiries, (now + expire_ms, name))
                    self.nbytes += size
                out.append(Found(NONE))
            elif record[0] == "o":
                record[0] = "s"
                self.open_count -= 1
                out.append(Found(OPEN, record[1], record[2]))
            else:
                out.append(Found(SETTLED))
        return out

    async def sweep(self, now_ms: int | None = None) -> None:
        self.sweep_now(self._now(now_ms))

    def sweep_now(self, now: int) -> None:
        heap, data = self._expiries, self._data
        expired = 0
        while heap and heap[0][0] <= now:
            expiry, name = heapq.heappop(heap)
            record = data.get(name)
            if record is None or record[3] != expiry:
                continue
            del data[name]
            self.nbytes -= RECORD_BYTES + len(name)
            if record[0] == "o":
                self.open_count -= 1
                expired += 1
        if expired:
            self._on_expired(expired)


def script_text() -> str:
    return (resources.files("rls") / "lua" / SCRIPT_FILE).read_text(encoding="utf-8")


class RedisReservations:
    """Reservations in Redis through lua/reservations.lua: one hash, one sorted set by expiry
    and one hash of totals under the `{rsv}` hash tag (one Cluster slot, so one script sees
    them all). It rides the counter store (`backend`): its client, breaker and way to Redis
    (`RedisBackend.script_call`), like the frequency counters."""

    name = "redis"

    def __init__(
        self,
        backend: Any,
        prefix: str,
        max_bytes: int,
        on_expired: Callable[[int], None] = lambda _n: None,
        timeout_s: float = 1.0,
    ) -> None:
        self.backend = backend
        self.max_bytes = max_bytes
        self._on_expired = on_expired
        self.timeout_s = timeout_s
        base = f"{prefix}{{rsv}}"
        self.keys = [f"{base}:h", f"{base}:z", f"{base}:n"]
        self._script = backend.client.register_script(script_text())
        self._lag = LoopLag()  # not ticking: its deadline is on the wall clock
        self.open_count = 0
        self.nbytes = 0

    async def _call(
        self, mode: str, now_ms: int | None, rest: Sequence[Any]
    ) -> tuple[int, list[Any]]:
        """One script call: (records the sweep dropped, the mode's answers)."""
        args = [mode, "" if now_ms is None else str(now_ms), self.max_bytes, RECORD_BYTES,
                SWEEP_BATCH, *rest]
        deadline = Deadline(self._lag, self.timeout_s, self.timeout_s)
        reply = await self.backend.script_call(self._script, self.keys, args, deadline)
        expired = int(reply[0])
        if expired:
            self._on_expired(expired)
        self.open_count, self.nbytes = int(reply[-2]), int(reply[-1])
        return int(reply[1]), list(reply[2:-2])

    async def open(self, openings: Sequence[Opening], now_ms: int | None = None) -> list[bool]:
        rest: list[Any] = []
        for o in openings:
            # plain ints: hiredis packs no int subclass (a YAML-sourced value)
            rest += [o.member, int(o.estimate), int(o.window_end_ms), int(o.expire_ms)]
        _, answers = await self._call("o", now_ms, rest)
        return [int(r) == 1 for r in answers]

    async def settle(
        self, members: Sequence[tuple[str, int]], now_ms: int | None = None
    ) -> list[Found]:
        rest: list[Any] = []
        for name, expire_ms in members:
            rest += [name, int(expire_ms)]
        out = []
        _, answers = await self._call("s", now_ms, rest)
        for raw in answers:
            state = raw.decode() if isinstance(raw, bytes) else str(raw)
            if not state:
                out.append(Found(NONE))
            elif state.startswith("o"):
                _, estimate, end = state.split(",")
                out.append(Found(OPEN, int(estimate), int(end)))
            else:
                out.append(Found(SETTLED))
        return out

    async def sweep(self, now_ms: int | None = None) -> None:
        for _ in range(64):  # a backlog of 64 batches waits for the next sweep
            dropped, _ = await self._call("w", now_ms, ())
            if dropped < SWEEP_BATCH:
                return


def reservations_for(
    backend: Backend, prefix: str, max_bytes: int, on_expired: Callable[[int], None],
    timeout_s: float = 1.0,
) -> ReservationStore:
    """The reservations of `backend`: in Redis beside a Redis store's counters, else here."""
    if backend.name == "redis" and hasattr(backend, "script_call"):
        return RedisReservations(backend, prefix, max_bytes, on_expired, timeout_s)
    return MemoryReservations(max_bytes, on_expired)
