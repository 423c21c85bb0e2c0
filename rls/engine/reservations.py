"""`reserve:` in a decision (docs/token-budgets.md): hold an estimate at request time, settle
it against the actual cost when the stream ends.

Envoy sends both calls through its stock ratelimit filter: the request-time entry with the
request id as a descriptor entry (`request_headers: x-request-id`), the stream-done entry
(`apply_on_stream_done`) with the same entries plus a fixed one (`generic_key`) and the actual
cost as its hits_addend. Both calls carry the same gRPC metadata, so the phase comes from the
descriptor: a descriptor with a settle entry is a settle, one without is a reservation.

Both entries are taken out of the descriptor before it is matched (`split`): they are never
part of a counter key, and the rest of the decision sees the descriptor the limits were
written for.

- Request time (`reserving`): a `reserve:` limit's check charges the estimate (its `estimate`,
  or the call's hits_addend) as a plain charge: all or nothing with the request's other
  checks, nothing when the request is refused (never the explicit-cost rule that charges
  stream-end costs whatever the decision). Admitted, each such check's reservation is recorded
  (`record`): request id and counter key -> estimate, window, expiry.
- Stream end (`settling`): each reservation is taken (atomically: a second settle finds it
  settled and changes nothing); actual - estimate is charged when positive (whatever the
  room, like an explicit cost: the tokens were used), the difference released when negative
  (never below zero; not when the reservation's window has ended: its counter is gone). A
  settle without a reservation charges the actual cost as a plain explicit cost.
- A reservation never settled is dropped at its expiry with its estimate still charged
  (rls.stores.reservations).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from rls.config.model import Domain
from rls.core.algorithms.fixed_window import window_bounds
from rls.core.model import CHARGE_ALWAYS, NEGATIVE, QUOTA, SHADOW, Check
from rls.engine.decision import DescriptorIn
from rls.observability.metrics import Metrics
from rls.stores.base import BackendError
from rls.stores.reservations import NONE, OPEN, Found, Opening, ReservationStore, member

# How often the limiter sweeps expired reservations (rls.stores.reservations): no
# reservation stays open past its expiry by more than this.
SWEEP_INTERVAL_S = 1.0


@dataclass(slots=True, frozen=True)
class Tag:
    """What a descriptor's reserve entries said: the request id ("" none), whether it settles."""

    request_id: str = ""
    settle: bool = False


PLAIN = Tag()


def split(
    dom: Domain, descriptors: Sequence[DescriptorIn]
) -> tuple[list[DescriptorIn], list[Tag]] | None:
    """The descriptors without the domain's reserve entries, and per descriptor what they said;
    None when no descriptor has any (the request is decided as ever)."""
    ids, settles = dom.reserve_ids, dom.reserve_settles
    out: list[DescriptorIn] | None = None
    tags: list[Tag] = []
    for i, desc in enumerate(descriptors):
        entries = desc.entries
        if not any(k in ids or k in settles for k, _ in entries):
            tags.append(PLAIN)
            if out is not None:
                out.append(desc)
            continue
        if out is None:
            out = list(descriptors[:i])
        rid = next((v for k, v in entries if k in ids), "")
        kept = tuple((k, v) for k, v in entries if k not in ids and k not in settles)
        tags.append(Tag(rid, any(k in settles for k, _ in entries)))
        out.append(DescriptorIn(kept, desc.hits, desc.negative, desc.override))
    return None if out is None else (out, tags)


def window_end(check: Check, now_ms: int) -> int:
    """End of the window `check` charges in (0: unknown, a rolling window: its key's own)."""
    if check.limit.rolling or not check.limit.window_ms:
        return 0
    return window_bounds(now_ms, check)[1]


class Reservations:
    """The limiter's side of `reserve:`: the checks of each phase, the store calls, metrics."""

    def __init__(self, store: ReservationStore, metrics: Metrics) -> None:
        self.store = store
        self.metrics = metrics

    def reserving(
        self, checks: list[Check], tags: Sequence[Tag], now_ms: int | None
    ) -> list[Opening]:
        """Request time: each reserve limit's check (of a descriptor with a request id) charges
        the estimate as a plain charge. The reservations to record once admitted."""
        now = _now(now_ms)
        openings = []
        for check in checks:
            reserve = check.limit.reserve
            rid = tags[check.descriptor].request_id
            if reserve is None or not rid or check.flags & NEGATIVE:
                continue
            check.hits = reserve.estimate or check.hits
            check.flags &= ~CHARGE_ALWAYS
            openings.append(Opening(
                member(check.key, rid), check.hits, window_end(check, now), reserve.expire_ms
            ))
        return openings

    async def record(self, openings: list[Opening], now_ms: int | None) -> None:
        """Record an admitted request's reservations; a store failure or the bound leaves them
        unrecorded (their settle then charges the actual cost on top of the estimate)."""
        try:
            recorded = await self.store.open(openings, now_ms)
        except (BackendError, TimeoutError):
            recorded = [False] * len(openings)
        missed = recorded.count(False)
        if missed:
            self.metrics.reservations_unrecorded.inc(missed)

    async def settling(
        self, checks: list[Check], tags: Sequence[Tag], now_ms: int | None
    ) -> list[Check]:
        """Stream end: the checks that settle each reservation (the difference charged or
        released, nothing for a repeat); other checks as they are (explicit costs). Raises
        BackendError / TimeoutError when the reservations could not be taken."""
        which: list[int] = []
        taking: list[tuple[str, int]] = []
        for i, check in enumerate(checks):
            reserve = check.limit.reserve
            rid = tags[check.descriptor].request_id
            if reserve is not None and rid and tags[check.descriptor].settle:
                which.append(i)
                taking.append((member(check.key, rid), reserve.expire_ms))
        if not taking:
            return checks
        found = await self.store.settle(taking, now_ms)
        now = _now(now_ms)
        settled: dict[int, Check | None] = {}
        for i, got in zip(which, found, strict=True):
            settled[i] = self._settle(checks[i], got, now)
        out = []
        for i, check in enumerate(checks):
            done = settled[i] if i in settled else check
            if done is not None:
                out.append(done)
        return out

    def _settle(self, check: Check, found: Found, now: int) -> Check | None:
        """The check that settles one reservation (None: nothing to charge or release)."""
        keep = check.flags & (SHADOW | QUOTA)
        actual = check.hits
        if found.state == NONE:
            self.metrics.settles_unreserved.inc()
            return _with(check, actual, keep | CHARGE_ALWAYS) if actual > 0 else None
        if found.state != OPEN:
            return None  # settled before: a repeat changes nothing
        self.metrics.reservations_settled.inc()
        delta = actual - found.estimate
        if delta > 0:
            return _with(check, delta, keep | CHARGE_ALWAYS)
        if delta < 0 and not (found.window_end_ms and now >= found.window_end_ms):
            return _with(check, -delta, keep | NEGATIVE)
        return None


def _with(check: Check, hits: int, flags: int) -> Check:
    return Check(check.descriptor, check.limit, check.key, hits, flags, check.stats_key,
                 check.bounds)


def _now(now_ms: int | None) -> int:
    return int(time.time() * 1000) if now_ms is None else now_ms
