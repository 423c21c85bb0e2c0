"""Rate-limit algorithms, each defined once in Python (memory backend) and once in lua/.

Both implementations expose the same two steps, so a request with several limits is decided
atomically: `evaluate` (is there room, what would remain) for every check, then `charge` for
the checks the admission rule selects.
"""

from __future__ import annotations

from rls.engine.algorithms.base import Algorithm
from rls.engine.algorithms.fixed_window import FixedWindow

ALGORITHMS: dict[str, Algorithm] = {
    "fixed_window": FixedWindow(),
}

# Numeric ids used by lua/decide.lua to dispatch (keep in sync with the Lua ALGOS table).
ALGORITHM_IDS: dict[str, int] = {"fixed_window": 1}

__all__ = ["ALGORITHMS", "ALGORITHM_IDS", "Algorithm"]
