"""Assemble the Redis Lua script from the files in lua/ (shipped in the wheel).

Each algorithm file adds its entry to a local ALGOS table; decide.lua dispatches on it. One
script for all algorithms keeps a request with mixed algorithms at one EVALSHA.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

# Libraries first, then one file per algorithm, each registering its id in ALGOS.
ALGORITHM_FILES = (
    "values.lua",
    "bucket_lib.lua",
    "log_lib.lua",
    "fixed_window.lua",
    "sliding_window.lua",
    "sliding_log.lua",
    "token_bucket.lua",
    "leaky_bucket.lua",
    "gcra.lua",
    "concurrency.lua",
)


@cache
def decide_script() -> str:
    lua = resources.files("rls") / "lua"
    parts = ["local ALGOS = {}", "local GRACE_MS = 1000"]
    parts += [(lua / name).read_text(encoding="utf-8") for name in ALGORITHM_FILES]
    parts.append((lua / "decide.lua").read_text(encoding="utf-8"))
    return "\n".join(parts)
