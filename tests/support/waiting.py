"""Waiting for a condition, the one way every suite does it: poll with a bound, never a blind
sleep, and fail loudly (with the logs of the processes involved) when it never comes."""

from __future__ import annotations

import time
from collections.abc import Callable

POLL_SECONDS = 0.02


class WaitTimeout(AssertionError, TimeoutError):
    """The condition never held. An AssertionError (a failed test, not an error) that callers
    written against TimeoutError still catch."""


def wait_until(
    predicate: Callable[[], object],
    timeout: float = 10.0,
    what: str = "",
    log: Callable[[], str] | None = None,
    *,
    alive: Callable[[], bool] | None = None,
) -> float:
    """Poll `predicate` until it is truthy; the seconds it took.

    An exception from `predicate` counts as "not yet" (a server still starting refuses
    connections). `alive`, when given, is checked on every poll: a process that exited fails
    the wait at once instead of after the whole timeout. `log` is appended to the failure.
    """
    start = time.monotonic()
    deadline = start + timeout
    problem = f"timed out after {timeout}s"
    while True:
        if alive is not None and not alive():
            problem = "process exited"
            break
        try:
            if predicate():
                return time.monotonic() - start
        except Exception:
            pass
        if time.monotonic() >= deadline:
            break
        time.sleep(POLL_SECONDS)
    details = log() if log is not None else ""
    suffix = f"\n{details}" if details else ""
    raise WaitTimeout(f"{problem} waiting for {what or predicate}{suffix}")
