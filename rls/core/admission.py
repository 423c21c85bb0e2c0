"""The request-level admission rule, shared by every backend (lua/decide.lua mirrors it).

A request is admitted when every enforcing (non-shadow, non-quota) check has room and, if it
has quota checks, at least one of them has room (reference quota_mode rule; a shadow quota
check counts as having room). Charging then follows:
- admitted: every check with room, plus shadow checks (they record usage like the reference);
- always: releases (negative hits) and `charge: always` limits, whatever the decision.
"""

from __future__ import annotations

from collections.abc import Sequence

from rls.core.model import CHARGE_ALWAYS, NEGATIVE, QUOTA, SHADOW


def admit(flags: Sequence[int], oks: Sequence[bool]) -> tuple[bool, list[bool]]:
    """(admitted, charge) for checks with these flags and room verdicts."""
    admitted = True
    quota_seen = False
    quota_room = False
    for f, ok in zip(flags, oks, strict=True):
        if f & NEGATIVE:
            continue
        if f & QUOTA:
            quota_seen = True
            if ok or f & SHADOW:
                quota_room = True
        elif not ok and not f & SHADOW:
            admitted = False
    if quota_seen and not quota_room:
        admitted = False
    charge = [
        bool(f & (NEGATIVE | CHARGE_ALWAYS)) or (admitted and (ok or bool(f & SHADOW)))
        for f, ok in zip(flags, oks, strict=True)
    ]
    return admitted, charge
