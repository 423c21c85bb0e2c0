"""Rate-limit algorithms, each defined once in Python (memory backend) and once in lua/.

Both implementations expose the same steps, so a request with several limits is decided
atomically: `evaluate` (is there room, what would remain) for every check, then `charge` or
`release` for the checks the admission rule selects.
"""

from __future__ import annotations

from rls.engine.algorithms.base import Algorithm
from rls.engine.algorithms.buckets import Gcra, LeakyBucket, TokenBucket
from rls.engine.algorithms.fixed_window import FixedWindow
from rls.engine.algorithms.log import Concurrency, SlidingLog
from rls.engine.algorithms.sliding_window import SlidingWindow

ALGORITHMS: dict[str, Algorithm] = {
    "fixed_window": FixedWindow(),
    "sliding_window": SlidingWindow(),
    "sliding_log": SlidingLog(),
    "token_bucket": TokenBucket(),
    "leaky_bucket": LeakyBucket(),
    "gcra": Gcra(),
    "concurrency": Concurrency(),
}

# Numeric ids used by lua/decide.lua to dispatch (the Lua files register the same numbers).
ALGORITHM_IDS: dict[str, int] = {
    "fixed_window": 1,
    "sliding_window": 2,
    "sliding_log": 3,
    "token_bucket": 4,
    "leaky_bucket": 5,
    "gcra": 6,
    "concurrency": 7,
}

__all__ = ["ALGORITHMS", "ALGORITHM_IDS", "Algorithm"]
