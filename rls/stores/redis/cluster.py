"""Redis Cluster: decisions per hash slot, judged by the breakers of the masters they need.

Keys carry no hash tag, so counters spread over all slots. A request whose keys share one slot
is decided atomically in one call. A request spanning slots is decided in two steps: evaluate
on every slot (no writes), apply the admission rule across all checks, then charge per slot as
admitted or rejected. Between the two steps a concurrent request may take the last unit of a
counter; the charge step re-checks room and the answer follows it (refused), so neither a limit
nor the admitted count is ever exceeded, and the charges such a refused request made on its
other slots are released right after (`_settle`): for that moment those counters read high, so
under contention a multi-slot request can under-admit, never over-admit.

Everything goes through redis-py's cluster client (its Script object reloads a script on
NOSCRIPT on the node that answers it). Its calls wait for one of `pool_size` slots here:
redis-py's cluster client fails a call at once (MaxConnectionsError) when a node's pool is
busy, where the standalone pool waits, so a burst would read as a failing store. The call's
deadline still bounds the wait (`rls.stores.guard.within`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from rls.core.admission import admit
from rls.core.model import NEGATIVE, Check, Outcome, Verdict
from rls.core.usage import UsageOp
from rls.stores.breaker import CircuitBreaker
from rls.stores.deadline import Deadline
from rls.stores.redis.clock import StoreClock
from rls.stores.redis.node_breakers import NodeBreakers, NodeGroup
from rls.stores.redis.scripts import ScriptBook, ScriptRunner
from rls.stores.redis.standalone import record_usage
from rls.stores.windows import store_key


class Cluster(ScriptRunner):
    """A Redis Cluster behind redis-py's cluster client, a breaker per master."""

    cluster = True
    wire = None

    def __init__(
        self, client: Any, book: ScriptBook, clock: StoreClock, pool_size: int,
        probe_client: Any, probe_thread: ThreadPoolExecutor, breaker: CircuitBreaker,
    ) -> None:
        self.client = client
        self.book = book
        self.clock = clock  # read at each call (tests set its reading)
        self.slots = asyncio.Semaphore(pool_size)  # decisions and frequency counters alike
        self._breaker = breaker
        self.nodes = NodeBreakers(
            client, probe_client, probe_thread, self._node_breaker, breaker.probe_interval
        )

    def watches(self, usage: Sequence[UsageOp]) -> bool:
        return False

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        await self.nodes.stop()

    def _node_breaker(self, name: str) -> CircuitBreaker:
        nodes, whole = self.nodes, self._breaker

        def changed(_state: str) -> None:
            whole.report("open" if nodes.any_open() else "closed")

        return CircuitBreaker(
            f"redis {name}", whole.threshold, probe_interval=whole.probe_interval,
            on_change=changed,
        )

    def judge(self, checks: Sequence[Check], now_ms: int | None) -> tuple[int, NodeGroup | None]:
        """The breakers of the masters owning this call's slots (at the time its windows are
        of, fixed here for all of its steps); None while no slot map is known yet."""
        now = self.clock.now_ms() if now_ms is None else now_ms
        client, nodes = self.client, self.nodes
        names = {nodes.owner(client.keyslot(store_key(c, now))) for c in checks}
        if None in names:  # no slot map yet: the client reads it on this call
            return now, None
        return now, nodes.group(n for n in names if n is not None)

    def owners(self, slot: int) -> NodeGroup | None:
        """The breaker of the master serving `slot` (None: no slot map yet)."""
        name = self.nodes.owner(slot)
        return None if name is None else self.nodes.group((name,))

    async def eval(
        self, script: Any, keys: Sequence[Any], args: Sequence[Any],
        deadline: Deadline | None = None,
    ) -> Any:
        """One script call, once one of the pool's slots is free."""
        async with self.slots:
            return await script(keys=keys, args=args)

    def _slots(self, checks: Sequence[Check], now_ms: int) -> list[list[int]]:
        """Indexes of the checks grouped by the Cluster slot of their keys at `now_ms`."""
        groups: dict[int, list[int]] = {}
        for i, c in enumerate(checks):
            groups.setdefault(self.client.keyslot(store_key(c, now_ms)), []).append(i)
        return list(groups.values())

    async def peek(self, checks: Sequence[Check], now_ms: int | None) -> Verdict:
        """Evaluate without charging: one call per slot."""
        if now_ms is None:
            now_ms = self.clock.now_ms()  # one window per counter for every slot
        outcomes: list[Outcome | None] = [None] * len(checks)
        for idx in self._slots(checks, now_ms):
            verdict = await self.run([checks[i] for i in idx], now_ms, "e")
            for i, out in zip(idx, verdict.outcomes, strict=True):
                outcomes[i] = out
        return _verdict(outcomes)

    async def decide(
        self, checks: Sequence[Check], now_ms: int | None, usage: Sequence[UsageOp],
        usage_ttl_ms: int,
    ) -> Verdict:
        if usage:
            verdict, _ = await asyncio.gather(
                self._decide(checks, now_ms), record_usage(self.client, usage, usage_ttl_ms)
            )
            return verdict
        return await self._decide(checks, now_ms)

    async def _decide(self, checks: Sequence[Check], now_ms: int | None) -> Verdict:
        if now_ms is None:
            now_ms = self.clock.now_ms()  # one time for both steps, all slots and windows
        parts = self._slots(checks, now_ms)
        if len(parts) == 1:
            return await self.run(checks, now_ms, "d")
        evaluated = await asyncio.gather(
            *(self.run([checks[i] for i in idx], now_ms, "e") for idx in parts)
        )
        oks = [False] * len(checks)
        for idx, verdict in zip(parts, evaluated, strict=True):
            for i, out in zip(idx, verdict.outcomes, strict=True):
                oks[i] = out.ok
        admitted, _ = admit([c.flags for c in checks], oks)
        mode = "a" if admitted else "r"
        charged = await asyncio.gather(
            *(self.run([checks[i] for i in idx], now_ms, mode) for idx in parts)
        )
        outcomes: list[Outcome | None] = [None] * len(checks)
        for idx, verdict in zip(parts, charged, strict=True):
            for i, out in zip(idx, verdict.outcomes, strict=True):
                outcomes[i] = out
        done = [o for o in outcomes if o is not None]
        if admitted:
            await self._settle(checks, done, now_ms)
            admitted, _ = admit([c.flags for c in checks], [o.ok for o in done])
        return Verdict(admitted, done)

    async def _settle(self, checks: Sequence[Check], outcomes: list[Outcome], now_ms: int) -> None:
        """After the charge step of an admitted multi-slot request: if a concurrent request
        took the last unit of a counter between the two steps, the charge step found it full
        and the request is refused after all (never admitted on a stale evaluation). Charges it
        made on the other slots are then given back, as a release on each, so a refused request
        ends up charging nothing (the reference's rule), at the cost of a moment in which those
        counters read high."""
        flags = [c.flags for c in checks]
        admitted, should_charge = admit(flags, [o.ok for o in outcomes])
        if admitted:
            return
        undo = [
            i for i, (c, o) in enumerate(zip(checks, outcomes, strict=True))
            if o.charged and c.hits > 0 and not should_charge[i]
        ]
        if not undo:
            return
        releases = [replace(checks[i], flags=checks[i].flags | NEGATIVE) for i in undo]
        await asyncio.gather(
            *(self.run([releases[i] for i in idx], now_ms, "d")
              for idx in self._slots(releases, now_ms))
        )
        for i in undo:
            outcomes[i] = replace(outcomes[i], charged=False)


def _verdict(outcomes: list[Outcome | None]) -> Verdict:
    done = [o for o in outcomes if o is not None]
    return Verdict(all(o.ok for o in done), done)
