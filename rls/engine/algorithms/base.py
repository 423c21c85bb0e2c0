"""The interface between an algorithm and the in-memory store.

State is whatever the algorithm keeps per key; the store keeps it with an absolute expiry and
hands back None once that has passed.
"""

from __future__ import annotations

from typing import Any, Protocol

from rls.config.model import Limit


class Algorithm(Protocol):
    def evaluate(
        self, state: Any, now_ms: int, limit: Limit, hits: int
    ) -> tuple[bool, int, int, int, int]:
        """(ok, remaining if charged, remaining if not, reset_ms, used) for the current state."""
        ...

    def charge(self, state: Any, now_ms: int, limit: Limit, hits: int) -> tuple[Any, int]:
        """(new state, absolute expiry in ms) after recording `hits`."""
        ...

    def release(self, state: Any, now_ms: int, limit: Limit, hits: int) -> tuple[Any, int]:
        """(new state, expiry) after giving `hits` back (is_negative_hits)."""
        ...
