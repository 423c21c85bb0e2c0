"""The one list of rate-limit algorithms: everything else derives from it.

An entry names the algorithm as written in YAML (`algorithm:`), its numeric id in the Redis
script's parameters, the Lua file in `lua/` that defines its Redis twin (`lua/<name>.lua`) with
the Lua libraries that file uses, and the memory implementation (this package). The config
parser takes its list of accepted names from here, the memory store its implementations, and
rls/stores/redis/scripts.py the Lua to load: adding an algorithm means one module here, one Lua
file and one entry below.

Kept free of rls imports beyond this package so that the config parser can read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rls.core.algorithms.base import Algorithm
from rls.core.algorithms.buckets import Gcra, LeakyBucket, TokenBucket
from rls.core.algorithms.fixed_window import FixedWindow
from rls.core.algorithms.log import Concurrency, SlidingLog
from rls.core.algorithms.sliding_window import SlidingWindow


@dataclass(frozen=True, slots=True)
class AlgorithmSpec:
    name: str
    id: int  # dispatch number in the Redis script parameters; never reuse one
    key_tag: str  # letter in the counter key's limit ident (config.model.Limit.ident)
    memory: Algorithm
    lua_libs: tuple[str, ...] = ()  # lua/<lib>.lua files the algorithm's Lua calls into
    burst: bool = False  # accepts `burst:`

    @property
    def lua(self) -> str:
        return f"{self.name}.lua"


REGISTRY: tuple[AlgorithmSpec, ...] = (
    AlgorithmSpec("fixed_window", 1, "f", FixedWindow(), ("values",)),
    AlgorithmSpec("sliding_window", 2, "s", SlidingWindow(), ("values",)),
    AlgorithmSpec("sliding_log", 3, "l", SlidingLog(), ("log_lib",)),
    AlgorithmSpec("token_bucket", 4, "t", TokenBucket(), ("values", "bucket_lib"), burst=True),
    AlgorithmSpec("leaky_bucket", 5, "k", LeakyBucket(), ("values", "bucket_lib"), burst=True),
    AlgorithmSpec("gcra", 6, "g", Gcra(), ("values",), burst=True),
    AlgorithmSpec("concurrency", 7, "c", Concurrency(), ("log_lib",)),
)

BY_NAME: dict[str, AlgorithmSpec] = {spec.name: spec for spec in REGISTRY}
ALGORITHM_NAMES: tuple[str, ...] = tuple(spec.name for spec in REGISTRY)
ALGORITHM_IDS: dict[str, int] = {spec.name: spec.id for spec in REGISTRY}
ALGORITHMS: dict[str, Algorithm] = {spec.name: spec.memory for spec in REGISTRY}
BURST_ALGORITHMS: tuple[str, ...] = tuple(spec.name for spec in REGISTRY if spec.burst)
KEY_TAGS: dict[str, str] = {spec.name: spec.key_tag for spec in REGISTRY}
