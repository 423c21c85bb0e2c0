"""Values that flow between the limiter and the backends: one small interface."""

from __future__ import annotations

from dataclasses import dataclass

from rls.core.limits import Limit

# Check flags, shared with lua/decide.lua (keep the numbers in sync).
SHADOW = 1
QUOTA = 2
CHARGE_ALWAYS = 4
NEGATIVE = 8


@dataclass(slots=True)
class Check:
    """One limit to evaluate for one request descriptor."""

    descriptor: int  # index of the descriptor in the request
    limit: Limit
    key: str
    hits: int
    flags: int = 0
    stats_key: str | None = None  # set only for detailed_metric / value_to_metric matches
    # Calendar window (start, end, previous start) in ms; None for epoch-aligned windows.
    bounds: tuple[int, int, int] | None = None


@dataclass(slots=True)
class Outcome:
    """What a backend reports for one check.

    `ok`: the check had room for its hits. `charged`: its hits were recorded. `remaining`: the
    quota left after this request (uncharged remaining when not charged, 0 when over).
    `reset_ms`: time until the limit lets the caller in again. `used`: usage before this request.
    """

    ok: bool
    charged: bool
    remaining: int
    reset_ms: int
    used: int


@dataclass(slots=True)
class Verdict:
    admitted: bool
    outcomes: list[Outcome]
