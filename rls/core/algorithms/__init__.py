"""Rate-limit algorithms, each defined once in Python (memory backend) and once in lua/.

Both implementations expose the same steps, so a request with several limits is decided
atomically: `evaluate` (is there room, what would remain) for every check, then `charge` or
`release` for the checks the admission rule selects. The list of algorithms is
rls/core/algorithms/registry.py.
"""

from __future__ import annotations

from rls.core.algorithms.base import Algorithm
from rls.core.algorithms.registry import (
    ALGORITHM_IDS,
    ALGORITHM_NAMES,
    ALGORITHMS,
    BY_NAME,
    REGISTRY,
    AlgorithmSpec,
)

__all__ = [
    "ALGORITHMS",
    "ALGORITHM_IDS",
    "ALGORITHM_NAMES",
    "BY_NAME",
    "REGISTRY",
    "Algorithm",
    "AlgorithmSpec",
]
