"""How much of a counter one stream may take now: pacing over the window, equal shares among
this process's streams, and the demand a report projects.

A counter shared with others (other Envoys, other rls processes) is paced: a stream gets its
room spread evenly over what is left of the window (`paced`), so the first stream to report
after a reset cannot take the whole window. The ledgers of one counter held by this process
(one per stream and bucket) share the paced pool so that each ends the window at the same
total, used + grant (water-filling: a stream that wants less leaves the rest to the others;
`fair_cap`), so two streams with equal demand get equal halves whichever reports first after
a reset. Streams on other rls processes are not known here: pacing alone spreads the window
among them.
"""

from __future__ import annotations

import math

from rls.quota.ledger import Ledger

REPORT_CADENCE_S = 5.0  # Envoy 1.40 reports every 5 s whatever reporting_interval says
# A grant covers this much of the bucket's recent demand: the 5 s until the next report plus
# slack for demand growing between reports.
HORIZON_S = 7.5
IDLE_SHARE_DIVISOR = 4


def paced(room: int, reset_ms: int) -> int:
    """The part of a shared counter's room one stream may take now: the room spread evenly
    over what is left of the window, one horizon's worth (all of it in the last horizon).

    So the first stream to report after a reset cannot take the whole window, admissions are
    spread over the window, and streams with demand above their pace get equal shares.
    """
    if room <= 0:
        return 0
    horizon_ms = HORIZON_S * 1000
    if reset_ms <= horizon_ms:
        return room
    return max(1, math.ceil(room * horizon_ms / reset_ms))


def dealable(pool: int, reset_ms: int, demand: int | None) -> int:
    """What the streams of one counter may be dealt over the next horizon: the pool paced over
    the rest of the window, or all of it when their demand is all known (`demand`: what they
    asked for over one horizon, summed; None when a stream's demand, or another user of the
    counter, is unknown) and at least the pool.

    Demand that would use the whole pool within one horizon leaves pacing nothing to spread:
    it could only hold part of the limit back from a burst that ends early in the window.
    What pacing buys stays: no stream takes a window first while another's demand is unknown,
    and the equal window totals of `fair_cap` give each stream its part of a known demand.
    """
    if demand is not None and demand >= pool:
        return max(0, pool)
    return paced(pool, reset_ms)


def demand_target(requests: int, elapsed_s: float) -> int:
    """Tokens covering `requests` seen over `elapsed_s`, projected over one horizon."""
    if elapsed_s <= 0:
        return max(1, requests)
    return max(1, math.ceil(requests / elapsed_s * HORIZON_S))


def fair_cap(
    peers: dict[int, Ledger] | None,
    ledger: Ledger,
    base: int,
    room: int,
    reset_ms: int,
    want: int | None,
    now: int,
    used: int,
) -> int | None:
    """The most `ledger` may be granted when other streams of this process deal from the
    same counter (`peers`: this process's ledgers of that counter by id; None when it is
    alone): equal window totals by water-filling.

    What the local streams may hold over the next horizon is the pool (the room plus their
    unused reservations), paced unless their demand is all known and exceeds it (`dealable`;
    `used`: the counter's count in this window, to tell whether anyone else uses it). It is
    shared so that every stream ends at the same window total T (used so far + grant), a
    stream wanting less than that (its last report's demand) leaving the rest to the others.
    """
    if peers is None or len(peers) < 2 or id(ledger) not in peers:
        return None
    pool = room
    parts: list[tuple[int, int | None]] = []  # (used in this window, wanted or None)
    charged = ledger.mine  # what the peers put into the counter's current window
    known: int | None = want  # their demand summed, None once one is unknown
    for peer in peers.values():
        if peer is ledger:
            parts.append((max(0, ledger.mine - base), want))
            pool += base
            continue
        if peer.end_ms > now:
            pool += peer.reserved
            charged += peer.mine
            parts.append((max(0, peer.mine - peer.reserved), peer.demand or None))
        else:  # its window ended: it holds nothing of this one yet
            parts.append((0, peer.demand or None))
        known = known + peer.demand if known is not None and peer.demand_known else None
    if used > charged:  # someone else uses the counter too: their demand is unknown here
        known = None
    share = dealable(pool, reset_ms, known)

    def dealt(total: int) -> int:
        return sum(
            min(max(0, total - used), share if wanted is None else wanted)
            for used, wanted in parts
        )

    low, high = 0, max(used for used, _ in parts) + share
    while low < high:  # the smallest window total that deals the whole share
        mid = (low + high) // 2
        if dealt(mid) >= share:
            high = mid
        else:
            low = mid + 1
    return max(0, low - max(0, ledger.mine - base))
