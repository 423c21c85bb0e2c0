"""Assemble the Redis Lua script from the files in lua/ (shipped in the wheel).

Each algorithm file adds its entry to a local ALGOS table; decide.lua dispatches on it. One
script for all algorithms keeps a request with mixed algorithms at one EVALSHA.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

ALGORITHM_FILES = ("fixed_window.lua",)


@cache
def decide_script() -> str:
    lua = resources.files("rls") / "lua"
    parts = ["local ALGOS = {}"]
    parts += [(lua / name).read_text(encoding="utf-8") for name in ALGORITHM_FILES]
    parts.append((lua / "decide.lua").read_text(encoding="utf-8"))
    return "\n".join(parts)
