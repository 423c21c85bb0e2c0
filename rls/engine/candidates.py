"""Candidate limits in a decision: their checks, and what they would have answered.

A candidate check (rls/core/admission.py) rides in the same store call as the live checks,
after them; once the store answered, its verdict is reported (metrics, the top-talkers sketch)
and dropped, so the rest of the decision only ever sees live checks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from rls.core.algorithms.base import burst_of
from rls.core.model import NEGATIVE, Check, Outcome, candidate_flags
from rls.engine.calendar import CalendarCache
from rls.engine.decision import DescriptorIn
from rls.engine.top import NEAR, OVER, TopTalkers
from rls.observability.metrics import Metrics


def with_candidates(
    checks: list[Check], calendar: CalendarCache, now_ms: int | None
) -> tuple[list[Check], int]:
    """`checks` followed by a check per candidate limit of each, and how many were added: the
    same descriptor and hits, the live counter key + the candidate's ident, flags naming the
    live check it stands beside (a calendar candidate with its own window bounds)."""
    out = list(checks)
    for i, check in enumerate(checks):
        for cand in check.limit.candidates:
            bounds = None
            if cand.calendar:
                clock_ms = now_ms if now_ms is not None else int(time.time() * 1000)
                bounds = calendar.bounds(cand, clock_ms)
            out.append(
                Check(check.descriptor, cand, check.key + cand.ident, check.hits,
                      candidate_flags(check.flags, i), None, bounds)
            )
    return out, len(out) - len(checks)


def split_candidates(
    metrics: Metrics,
    top: TopTalkers,
    near_ratio: float,
    domain: str,
    descriptors: Sequence[DescriptorIn],
    checks: list[Check],
    outcomes: list[Outcome] | None,
    cands: int,
) -> tuple[list[Check], list[Outcome] | None]:
    """The live checks and outcomes, once the `cands` candidates at the end have reported
    their would-be verdicts (none when the store did not decide: a fallback or failure
    answer says nothing about a candidate)."""
    live = len(checks) - cands
    if outcomes is None:
        return checks[:live], None
    report_candidates(
        metrics, top, near_ratio, domain, descriptors, checks[live:], outcomes[live:]
    )
    return checks[:live], outcomes[:live]


def report_candidates(
    metrics: Metrics,
    top: TopTalkers,
    near_ratio: float,
    domain: str,
    descriptors: Sequence[DescriptorIn],
    checks: Sequence[Check],
    outcomes: Sequence[Outcome],
) -> None:
    """Count what each candidate check would have answered (releases report nothing)."""
    for check, out in zip(checks, outcomes, strict=True):
        if check.flags & NEGATIVE:
            continue
        limit = check.limit
        over = not out.ok
        near = not over and out.used + check.hits > int(limit.requests_per_unit * near_ratio)
        metrics.record_candidate(domain, limit, over, near)
        if over or near:
            top.record_candidate(
                domain, limit.full_key, limit.candidate, descriptors[check.descriptor].entries,
                OVER if over else NEAR, check.hits,
            )


def batch_verdict(check: Check, out: Outcome, near_ratio: float) -> tuple[int, int]:
    """(over, near) among the `check.hits` requests a candidate was charged with at once (a
    quota report): the requests numbered past its room would have been over the limit, those
    past its near-limit ratio but within it near (one request: exactly `report_candidates`)."""
    hits = check.hits
    if out.ok or hits <= 0:
        over = 0
    else:
        over = min(hits, max(1, out.used + hits - burst_of(check)))
    near_at = int(check.limit.requests_per_unit * near_ratio)
    near = min(out.used + hits, burst_of(check)) - max(out.used, near_at)
    return over, max(0, min(near, hits - over))


@dataclass(slots=True)
class CandidateReporter:
    """Where candidate verdicts of quota reports go: the same series and top-talkers sketch
    as the per-request ones."""

    metrics: Metrics
    top: TopTalkers
    near_ratio: float

    def batch(
        self, domain: str, entries: Callable[[], Iterable[tuple[str, str]]], check: Check,
        out: Outcome,
    ) -> None:
        """`entries`: the descriptor, asked for only when the sketch records it."""
        limit = check.limit
        over, near = batch_verdict(check, out, self.near_ratio)
        self.metrics.record_candidate_counts(domain, limit, check.hits, over, near)
        if over or near:
            descriptor = list(entries())
            for kind, count in ((OVER, over), (NEAR, near)):
                if count:
                    self.top.record_candidate(
                        domain, limit.full_key, limit.candidate, descriptor, kind, count
                    )
