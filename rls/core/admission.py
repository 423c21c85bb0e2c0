"""The request-level admission rule, shared by every backend (lua/decide.lua mirrors it).

A request is admitted when every enforcing (non-shadow, non-quota) check has room and, if it
has quota checks, at least one of them has room (reference quota_mode rule; a shadow quota
check counts as having room). Charging then follows:
- admitted: every check with room, plus shadow checks (they record usage like the reference);
- always: releases (negative hits) and `charge: always` limits, whatever the decision.

Candidate checks (CANDIDATE flag, rls/core/model.py) never take part in the admission. Each
stands in for one live check (its twin) and is charged as that live check would be if the
candidate's verdict replaced the twin's: the request as it would have been decided with the
candidate in force, every other check as it is. So a candidate equal to its live limit is
charged exactly when the live limit is, and reports exactly the live over-limit decisions.
"""

from __future__ import annotations

from collections.abc import Sequence

from rls.core.model import CANDIDATE, CHARGE_ALWAYS, NEGATIVE, QUOTA, SHADOW, twin_of


def admit(flags: Sequence[int], oks: Sequence[bool]) -> tuple[bool, list[bool]]:
    """(admitted, charge) for checks with these flags and room verdicts."""
    failing = 0  # enforcing checks without room
    quota_seen = False
    quota_room = 0  # quota checks with room (or shadow)
    candidates = False
    for f, ok in zip(flags, oks, strict=True):
        if f & (NEGATIVE | CANDIDATE):
            candidates = candidates or bool(f & CANDIDATE)
            continue
        if f & QUOTA:
            quota_seen = True
            if ok or f & SHADOW:
                quota_room += 1
        elif not ok and not f & SHADOW:
            failing += 1
    admitted = failing == 0 and (not quota_seen or quota_room > 0)
    charge = [
        bool(f & (NEGATIVE | CHARGE_ALWAYS)) or (admitted and (ok or bool(f & SHADOW)))
        for f, ok in zip(flags, oks, strict=True)
    ]
    if candidates:
        for i, (f, ok) in enumerate(zip(flags, oks, strict=True)):
            if f & CANDIDATE and not f & (NEGATIVE | CHARGE_ALWAYS):
                charge[i] = _would_admit(f, ok, oks[twin_of(f)], failing, quota_seen,
                                         quota_room) and (ok or bool(f & SHADOW))
    return admitted, charge


def _would_admit(
    f: int, ok: bool, twin_ok: bool, failing: int, quota_seen: bool, quota_room: int
) -> bool:
    """The admission with this candidate's verdict in place of its twin's (same flags)."""
    shadow = bool(f & SHADOW)
    if f & QUOTA:
        room = quota_room - (twin_ok or shadow) + (ok or shadow)
        return failing == 0 and room > 0
    if not shadow:
        failing += (not ok) - (not twin_ok)
    return failing == 0 and (not quota_seen or quota_room > 0)
