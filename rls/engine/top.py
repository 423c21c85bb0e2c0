"""Top talkers: which descriptors are being limited right now, in bounded memory.

Request values never become Prometheus labels (unbounded cardinality); this answers "who is
limited?" instead, per domain, with a Space-Saving heavy-hitters sketch (Metwally et al.): at most
`capacity` counters per domain and time slot; a new descriptor takes over the smallest counter
and inherits its count as its error bound, so every count is an over-estimate by at most
`error`, and any descriptor with more than total/capacity hits is guaranteed to be listed.

Time is cut into 12 s slots kept for 5 minutes; the 1-minute and 5-minute views merge the last
5 and 25 slots. Descriptor texts are cut to `MAX_TEXT` bytes, so memory is bounded by
domains x slots x capacity x MAX_TEXT whatever the traffic. Only over-limit and near-limit
descriptors are recorded, so the sketch costs nothing on calls that are comfortably within
their limits.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any

SLOT_SECONDS = 12
SLOTS = 25  # 5 minutes
WINDOWS = {"1m": 5, "5m": 25}
CAPACITY = 64  # counters per domain and slot
MAX_TEXT = 256  # bytes of descriptor text kept
MAX_DOMAINS = 256

OVER, NEAR = 0, 1


def descriptor_text(entries: Iterable[tuple[str, str]]) -> str:
    """`k1=v1,k2=v2`, cut to MAX_TEXT bytes."""
    text = ",".join(f"{k}={v}" for k, v in entries)
    if len(text) > MAX_TEXT:
        text = text.encode()[:MAX_TEXT].decode(errors="ignore")
    return text


class SpaceSaving:
    """Heavy hitters of one stream: text -> [over, near, error]."""

    __slots__ = ("capacity", "counts")

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self.counts: dict[str, list[int]] = {}

    def add(self, text: str, kind: int, hits: int) -> None:
        entry = self.counts.get(text)
        if entry is None:
            if len(self.counts) >= self.capacity:
                victim = min(self.counts, key=lambda t: self.counts[t][0] + self.counts[t][1])
                old = self.counts.pop(victim)
                floor = old[0] + old[1]
                entry = [0, 0, floor]
                entry[kind] = floor  # Space-Saving: inherit the evicted count as error
            else:
                entry = [0, 0, 0]
            self.counts[text] = entry
        entry[kind] += hits


class TopTalkers:
    """Per-domain sketches over rotating time slots; candidate limits (who *would* be limited)
    get sketches of their own, per domain, live limit and candidate."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # domain -> slot index -> sketch; a slot is reused when its index comes round again
        self._slots: dict[str, dict[int, SpaceSaving]] = {}
        # candidate_stream(domain, limit, candidate) -> slot index -> sketch
        self._candidates: dict[str, dict[int, SpaceSaving]] = {}

    def record(self, domain: str, entries: Iterable[tuple[str, str]], kind: int, hits: int) -> None:
        self._add(self._slots, domain, entries, kind, hits)

    def record_candidate(
        self, domain: str, limit: str, candidate: str, entries: Iterable[tuple[str, str]],
        kind: int, hits: int,
    ) -> None:
        """A descriptor the candidate `candidate` of limit `limit` would have found over (or
        near) it."""
        self._add(self._candidates, candidate_stream(domain, limit, candidate), entries, kind,
                  hits)

    def _add(
        self, streams: dict[str, dict[int, SpaceSaving]], domain: str,
        entries: Iterable[tuple[str, str]], kind: int, hits: int,
    ) -> None:
        slot = int(self._clock() // SLOT_SECONDS)
        domain_slots = streams.get(domain)
        if domain_slots is None:
            if len(streams) >= MAX_DOMAINS:
                return
            domain_slots = streams[domain] = {}
        sketch = domain_slots.get(slot)
        if sketch is None:
            for old in [s for s in domain_slots if s <= slot - SLOTS]:
                del domain_slots[old]
            sketch = domain_slots[slot] = SpaceSaving()
        sketch.add(descriptor_text(entries), kind, max(hits, 1))

    def snapshot(self) -> dict[str, Any]:
        """Plain data of the live slots (for the other workers to merge)."""
        now = int(self._clock() // SLOT_SECONDS)

        def live(streams: dict[str, dict[int, SpaceSaving]]) -> dict[str, Any]:
            return {
                name: {str(slot): sketch.counts for slot, sketch in slots.items()
                       if slot > now - SLOTS}
                for name, slots in streams.items()
            }

        snap = {"now": now, "domains": live(self._slots)}
        if self._candidates:
            snap["candidates"] = live(self._candidates)
        return snap


def candidate_stream(domain: str, limit: str, candidate: str) -> str:
    """The sketch name of one candidate: `domain` NUL `limit` NUL `candidate` (NUL is in none
    of them: they come from YAML keys and names)."""
    return f"{domain}\0{limit}\0{candidate}"


def merge_candidates(
    snapshots: Iterable[dict[str, Any]], window: str = "1m", sort: str = "over",
    domain: str | None = None, limit: int = 20,
) -> dict[str, list[dict[str, Any]]]:
    """Who the candidate limits would have limited over `window`, per domain: rows of
    `merge_top` with the live limit's stats key and the candidate's name."""
    streams = merge_top(
        ({"now": s["now"], "domains": s.get("candidates", {})} for s in snapshots),
        window=window, sort=sort, limit=limit,
    )
    out: dict[str, list[dict[str, Any]]] = {}
    for stream, rows in streams.items():
        dom, lim, cand = stream.split("\0")
        if domain is not None and dom != domain:
            continue
        out.setdefault(dom, []).extend({"limit": lim, "candidate": cand, **row} for row in rows)
    key = "over" if sort == "over" else "near"
    for rows in out.values():
        rows.sort(key=lambda r: (-r[key], r["limit"], r["candidate"], r["descriptor"]))
        del rows[limit:]
    return out


def merge_top(
    snapshots: Iterable[dict[str, Any]], window: str = "1m", sort: str = "over",
    domain: str | None = None, limit: int = 20,
) -> dict[str, list[dict[str, Any]]]:
    """The top descriptors per domain over `window`, summed over snapshots (workers)."""
    span = WINDOWS[window]
    key = 0 if sort == "over" else 1
    totals: dict[str, dict[str, list[int]]] = {}
    for snap in snapshots:
        now = snap["now"]
        for dom, slots in snap["domains"].items():
            if domain is not None and dom != domain:
                continue
            acc = totals.setdefault(dom, {})
            for slot, counts in slots.items():
                if int(slot) <= now - span:
                    continue
                for text, (over, near, error) in counts.items():
                    row = acc.setdefault(text, [0, 0, 0])
                    row[0] += over
                    row[1] += near
                    row[2] += error
    out: dict[str, list[dict[str, Any]]] = {}
    for dom, rows in sorted(totals.items()):
        ranked = sorted(rows.items(), key=lambda item: (-item[1][key], item[0]))[:limit]
        out[dom] = [
            {"descriptor": text, "over": over, "near": near, "error": error}
            for text, (over, near, error) in ranked
            if (over if key == 0 else near) > 0
        ]
    return out


def dumps_snapshot(top: TopTalkers) -> str:
    return json.dumps(top.snapshot(), separators=(",", ":"))
