"""Embedded in-memory counters: the default when no Redis is configured.

One process, one event loop: a request is decided without awaiting, so it is atomic. Expired
entries are dropped lazily on access and by a periodic sweep, so memory follows live keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from rls.core.admission import admit
from rls.core.algorithms import ALGORITHMS
from rls.core.model import NEGATIVE, Check, Outcome, Verdict
from rls.core.usage import UsageOp


class MemoryBackend:
    name = "memory"

    def __init__(self, clock: Callable[[], float] = time.time, sweep_interval: float = 5.0):
        self._clock = clock
        self._data: dict[str, tuple[Any, int]] = {}
        self._sweep_interval = sweep_interval
        self._sweeper: asyncio.Task[None] | None = None
        self._usage: dict[str, tuple[Any, int]] = {}  # daily counters and exact sets

    def __len__(self) -> int:
        return len(self._data)

    async def start(self) -> None:
        if self._sweeper is None and self._sweep_interval > 0:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None

    async def healthy(self) -> bool:
        return True

    def suspect(self) -> None:
        """In-process: nothing to probe."""

    async def decide(
        self,
        checks: Sequence[Check],
        now_ms: int | None = None,
        usage: Sequence[UsageOp] = (),
        usage_ttl_ms: int = 0,
    ) -> Verdict:
        if usage:
            self.record_usage_now(usage, usage_ttl_ms, now_ms)
        return self.decide_now(checks, now_ms)

    async def record_usage(
        self, ops: Sequence[UsageOp], ttl_ms: int, now_ms: int | None = None
    ) -> None:
        self.record_usage_now(ops, ttl_ms, now_ms)

    def record_usage_now(
        self, ops: Sequence[UsageOp], ttl_ms: int, now_ms: int | None = None
    ) -> None:
        now = int(self._clock() * 1000) if now_ms is None else now_ms
        data = self._usage
        for kind, key, member in ops:
            entry = data.get(key)
            if entry is None or entry[1] < now:
                value: Any = set() if kind == "h" else 0
            else:
                value = entry[0]
            if kind == "h":
                value.add(member)
            else:
                value += 1
            data[key] = (value, now + ttl_ms)

    async def usage_value(self, kind: str, key: str) -> int:
        now = int(self._clock() * 1000)
        entry = self._usage.get(key)
        if entry is None or entry[1] < now:
            return 0
        return len(entry[0]) if kind == "h" else int(entry[0])

    async def peek(self, checks: Sequence[Check], now_ms: int | None = None) -> Verdict:
        return self.decide_now(checks, now_ms, charge=False)

    def decide_now(
        self, checks: Sequence[Check], now_ms: int | None = None, charge: bool = True
    ) -> Verdict:
        if now_ms is None:
            now_ms = int(self._clock() * 1000)
        data = self._data
        rows = []
        flagged = False
        all_ok = True
        for check in checks:
            entry = data.get(check.key)
            # An expired entry reads as absent (the sweeper deletes it later).
            state = None if entry is None or entry[1] < now_ms else entry[0]
            algo = ALGORITHMS[check.limit.algorithm]
            ev = algo.evaluate(state, now_ms, check)
            rows.append((check, state, algo, ev))
            if check.flags:
                flagged = True
            if not ev[0]:
                all_ok = False
        if flagged:
            admitted, selected = admit([c.flags for c in checks], [r[3][0] for r in rows])
        else:  # no shadow, quota, release or charge-always: all or nothing
            admitted = all_ok
            selected = [all_ok] * len(rows)
        if not charge:
            selected = [False] * len(rows)
        outcomes = []
        for (check, state, algo, ev), do_charge in zip(rows, selected, strict=True):
            ok, rem_charged, rem_uncharged, reset, used = ev
            if do_charge:
                if check.flags & NEGATIVE:
                    new_state, expires = algo.release(state, now_ms, check)
                    rem_charged = _remaining_after_release(algo, new_state, now_ms, check)
                    ok = True
                else:
                    new_state, expires = algo.charge(state, now_ms, check)
                if new_state is None:  # nothing to keep (a rolling key left without window)
                    data.pop(check.key, None)
                else:
                    data[check.key] = (new_state, expires)
                outcomes.append(Outcome(ok, True, rem_charged, reset, used))
            else:
                outcomes.append(Outcome(ok, False, rem_uncharged if ok else 0, reset, used))
        return Verdict(admitted, outcomes)

    def sweep(self, now_ms: int | None = None) -> int:
        if now_ms is None:
            now_ms = int(self._clock() * 1000)
        dead = [k for k, (_, exp) in self._data.items() if exp < now_ms]
        for k in dead:
            del self._data[k]
        stale = [k for k, (_, exp) in self._usage.items() if exp < now_ms]
        for k in stale:
            del self._usage[k]
        return len(dead) + len(stale)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_interval)
            self.sweep()


def _remaining_after_release(algo: Any, state: Any, now_ms: int, check: Check) -> int:
    """What remains once hits were given back: an uncharged look at the new state."""
    return int(algo.evaluate(state, now_ms, replace(check, hits=0))[2])
