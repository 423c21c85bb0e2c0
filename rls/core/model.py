"""Values that flow between the limiter and the backends: one small interface."""

from __future__ import annotations

from dataclasses import dataclass

from rls.core.limits import Limit

# Check flags, shared with lua/decide.lua (keep the numbers in sync).
SHADOW = 1
QUOTA = 2
CHARGE_ALWAYS = 4
NEGATIVE = 8
# A candidate limit (rls/core/admission.py): counted beside the live check it shadows, whose
# index in the request's check list sits in the bits from TWIN_SHIFT up; it never changes the
# admission. Flags travel to Lua as doubles and are read with Lua's 32-bit `bit` library:
# indexes stay far below 2^(31 - TWIN_SHIFT).
CANDIDATE = 16
TWIN_SHIFT = 5
FLAG_BITS = (1 << TWIN_SHIFT) - 1


def candidate_flags(live_flags: int, twin: int) -> int:
    """Flags of a candidate of the live check at index `twin` (its shadow, quota, charging and
    release bits are the live check's: the candidate stands in for it)."""
    return CANDIDATE | (live_flags & FLAG_BITS & ~CANDIDATE) | (twin << TWIN_SHIFT)


def twin_of(flags: int) -> int:
    """Index of the live check a candidate's flags name."""
    return flags >> TWIN_SHIFT


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
