"""The interface between an algorithm and the in-memory store.

State is whatever the algorithm keeps per key; the store keeps it with an absolute expiry and
hands back None once that has passed. The Lua twin of each algorithm (lua/<name>.lua) has the
same three steps and must compute bit-identical results: arithmetic is done in floats in the
same order on both sides (Lua numbers are IEEE doubles, like Python floats).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # only for hints: the config parser imports this package
    from rls.core.model import Check

# (ok, remaining if charged, remaining if not, reset ms, used before this request)
Evaluation = tuple[bool, int, int, int, int]
GRACE_MS = 1000  # expiry slack beyond the last moment a state matters


class Algorithm(Protocol):
    def evaluate(self, state: Any, now_ms: int, check: Check) -> Evaluation:
        """Room verdict and figures for the current state, without changing it."""
        ...

    def charge(self, state: Any, now_ms: int, check: Check) -> tuple[Any, int]:
        """(new state, absolute expiry in ms) after recording `check.hits`."""
        ...

    def release(self, state: Any, now_ms: int, check: Check) -> tuple[Any, int]:
        """(new state, expiry) after giving `check.hits` back (is_negative_hits)."""
        ...


def burst_of(check: Check) -> int:
    limit = check.limit
    return limit.burst if limit.burst is not None else limit.requests_per_unit
