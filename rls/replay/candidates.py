"""Candidate limits (`candidates:`) in a replay: what each would have answered, as in production.

The replay's engine is the service's RateLimiter, which already counts every candidate in the
same store call as its live limit and reports the would-be verdicts through
rls/engine/candidates.py to two places: the metrics (`record_candidate_counts`: decisions,
would-be over, near) and the top-talkers sketch (`record_candidate`: who, over or near, in
hits like `rls top`). Replay hands the limiter a Metrics and a TopTalkers that also write
those same calls into this tally with the log's time, so the report holds exactly what
production would have counted: nothing about candidates is decided here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rls.config.model import Limit
from rls.engine.top import OVER, TopTalkers, descriptor_text
from rls.observability.metrics import Metrics

MAX_ROWS = 10_000  # (candidate, descriptor) rows kept; the rest go to one OTHER row
OTHER = "(other descriptors)"


class CandidateTally:
    """Per candidate [checks, over, near, first, last] (decisions; first/last: the first and
    last would-be over or near), per candidate and descriptor [over, near, first, last]
    (hits, at least 1 per decision, like `rls top`). `now` is the time of the decision being
    made (the engine sets it)."""

    def __init__(self) -> None:
        self.now = 0
        self.totals: dict[tuple[str, str, str], list[int]] = {}
        self.who: dict[tuple[str, str, str, str], list[int]] = {}

    def count(self, key: tuple[str, str, str], checks: int, over: int, near: int) -> None:
        row = self.totals.get(key)
        if row is None:
            row = self.totals[key] = [0, 0, 0, 1 << 62, -(1 << 62)]
        row[0] += checks
        row[1] += over
        row[2] += near
        if over or near:
            row[3] = min(row[3], self.now)
            row[4] = max(row[4], self.now)

    def record(self, key: tuple[str, str, str, str], kind: int, hits: int) -> None:
        row = self.who.get(key)
        if row is None:
            if len(self.who) >= MAX_ROWS:
                key = (*key[:3], OTHER)
                row = self.who.get(key)
            if row is None:
                row = self.who[key] = [0, 0, self.now, self.now]
        row[0 if kind == OVER else 1] += max(hits, 1)
        row[2] = min(row[2], self.now)
        row[3] = max(row[3], self.now)

    def as_json(self, iso: Any) -> dict[str, list[dict[str, Any]]]:
        """The report's `candidates` (per candidate) and `candidates_limited` (who) lists;
        `iso` formats a time."""
        def when(first: int, last: int) -> tuple[Any, Any]:
            return (iso(first), iso(last)) if first <= last else (None, None)

        totals = []
        for (dom, lim, cand), (checks, over, near, first, last) in sorted(
            self.totals.items(), key=lambda kv: (-kv[1][1], -kv[1][2], kv[0])
        ):
            start, end = when(first, last)
            totals.append({"domain": dom, "limit": lim, "candidate": cand, "checks": checks,
                           "over_limit": over, "near_limit": near, "first": start,
                           "last": end})
        who = [
            {"domain": dom, "limit": lim, "candidate": cand, "descriptor": text,
             "over_limit": v[0], "near_limit": v[1], "first": iso(v[2]), "last": iso(v[3])}
            for (dom, lim, cand, text), v in sorted(
                self.who.items(), key=lambda kv: (-kv[1][0], -kv[1][1], kv[0])
            )
        ]
        return {"candidates": totals, "candidates_limited": who}


class CandidateMetrics(Metrics):
    """The engine's metrics, whose candidate counts also go to the tally."""

    def __init__(self, tally: CandidateTally) -> None:
        super().__init__()
        self.tally = tally

    def record_candidate_counts(
        self, domain: str, limit: Limit, checks: int, over: int, near: int
    ) -> None:
        super().record_candidate_counts(domain, limit, checks, over, near)
        self.tally.count((domain, limit.full_key, limit.candidate), checks, over, near)


class CandidateTop(TopTalkers):
    """The engine's top-talkers sketch: candidate rows go to the tally; the live rows are not
    kept (replay tallies who is limited from the decisions themselves)."""

    def __init__(self, tally: CandidateTally) -> None:
        super().__init__()
        self.tally = tally

    def record(self, domain: str, entries: Iterable[tuple[str, str]], kind: int,
               hits: int) -> None:
        return

    def record_candidate(
        self, domain: str, limit: str, candidate: str, entries: Iterable[tuple[str, str]],
        kind: int, hits: int,
    ) -> None:
        self.tally.record((domain, limit, candidate, descriptor_text(entries)), kind, hits)
