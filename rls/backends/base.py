"""What the limiter needs from a counter store: decide a whole request in one atomic step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rls.engine.model import Check, Verdict


class BackendError(Exception):
    """The store could not answer (down, slow, out of memory); the failure mode applies."""


class Backend(Protocol):
    name: str

    async def decide(self, checks: Sequence[Check], now_ms: int | None = None) -> Verdict:
        """Evaluate every check, charge per the admission rule, all atomically.

        Each (key, flags) appears at most once: the limiter folds checks that share a counter
        into one before calling (see limiter._merge_same_counter).

        `now_ms` overrides the store's clock (tests, replay); None uses the store's own clock
        (Redis TIME for Redis, so every replica agrees).
        """
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def healthy(self) -> bool: ...
