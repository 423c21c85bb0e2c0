"""Circuit breaker: stop waiting on a dead store, probe it now and then, close when it answers.

Closed: calls go through; `threshold` consecutive failures open it. Open: calls fail at once
(the failure mode answers within microseconds instead of a timeout per call) until `cooldown`
has passed. Half-open: one probe call goes through; success closes, failure re-opens.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("rls.backend")

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


class CircuitBreaker:
    def __init__(
        self,
        name: str,
        threshold: int = 3,
        cooldown: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[str], None] | None = None,
    ) -> None:
        self.name = name
        self.threshold = threshold
        self.cooldown = cooldown
        self._clock = clock
        self._on_change = on_change
        self.state = CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._probing = False

    def allow(self) -> bool:
        """Whether a call may go to the store now."""
        if self.state == CLOSED:
            return True
        if self.state == OPEN and self._clock() - self._opened_at >= self.cooldown:
            self._set(HALF_OPEN)
        if self.state == HALF_OPEN and not self._probing:
            self._probing = True
            return True
        return False

    def success(self) -> None:
        self._failures = 0
        self._probing = False
        if self.state != CLOSED:
            self._set(CLOSED)

    def failure(self) -> None:
        self._probing = False
        self._failures += 1
        if self.state == HALF_OPEN or self._failures >= self.threshold:
            self._opened_at = self._clock()
            if self.state != OPEN:
                self._set(OPEN)

    def _set(self, state: str) -> None:
        log.warning("backend %s circuit %s -> %s", self.name, self.state, state)
        self.state = state
        if self._on_change is not None:
            self._on_change(state)
