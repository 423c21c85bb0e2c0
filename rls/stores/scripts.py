"""Build the Redis Lua scripts from the files in lua/ (shipped in the wheel).

Redis runs a script's whole body on every EVALSHA, so a script that defined every algorithm
paid for all of them on every call. Scripts are instead built per request shape:
- `lean_script()`: every check a plain fixed window (no overdraft, no calendar, not rolling),
  the common case (lua/decide_fixed_window.lua: a GET per check, a SET per charge, nothing else);
- `decide_script(names)`: lua/decide.lua with only the named algorithms and the libraries they
  use, so a request mixing algorithms is still one EVALSHA and atomic.
Each script starts with a prelude generated from the Python constants (flag bits, GRACE_MS),
and each algorithm file (`lua/<name>.lua`, ending in `return {evaluate, charge, release}`)
is registered under its id from rls/core/algorithms/registry.py. There are at most
2^len(REGISTRY) mixes, so the caches below are bounded by construction.

Scripts rather than Redis Functions: EVALSHA works on every Redis the service supports (Redis
6 has no Functions), on Cluster without loading a library into every primary (redis-py loads a
script on the node that answers NOSCRIPT), and scripts are addressed by their SHA, so two rls
versions side by side during a rolling upgrade never replace each other's code.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from functools import cache
from importlib import resources
from typing import Any

from rls.core.algorithms.base import GRACE_MS
from rls.core.algorithms.registry import BY_NAME, REGISTRY
from rls.core.model import CHARGE_ALWAYS, NEGATIVE, QUOTA, SHADOW, Check, Outcome, Verdict

LEAN_FILE = "decide_fixed_window.lua"
DECIDE_FILE = "decide.lua"
REQUEST_FILE = "request.lua"  # now / mode / params, read once for every decide script
LIBRARY_ORDER = ("values", "bucket_lib", "log_lib")  # a library may call the ones before it

# Per-check parameters, packed as little-endian doubles (exact for integers below 2^53).
LEAN_CHECK = struct.Struct("<dddd")  # lean script: flags, hits, limit, window ms
CHECK = struct.Struct("<ddddddddddd")  # decide.lua: id, flags, hits, limit, window, burst,
#   overdraft, calendar window start, end, previous start, rolling (0 / 1)

# Every Lua file a script can be built from (the wheel and the image must ship them all).
ALGORITHM_FILES: tuple[str, ...] = (
    *(f"{lib}.lua" for lib in LIBRARY_ORDER),
    *(spec.lua for spec in REGISTRY),
    REQUEST_FILE,
    LEAN_FILE,
)


def prelude() -> str:
    """Constants shared with Python, defined once there."""
    return (
        "local SHADOW, QUOTA, CHARGE_ALWAYS, NEGATIVE = "
        f"{SHADOW}, {QUOTA}, {CHARGE_ALWAYS}, {NEGATIVE}\n"
        f"local GRACE_MS = {GRACE_MS}"
    )


@cache
def _lua(name: str) -> str:
    return (resources.files("rls") / "lua" / name).read_text(encoding="utf-8")


@cache
def lean_script() -> str:
    return "\n".join((prelude(), _lua(REQUEST_FILE), _lua(LEAN_FILE)))


@cache
def _decide_script(names: frozenset[str]) -> str:
    specs = sorted((BY_NAME[name] for name in names), key=lambda s: s.id)
    libs = {lib for spec in specs for lib in spec.lua_libs}
    parts = [prelude(), "local ALGOS = {}"]
    parts += [_lua(f"{lib}.lua") for lib in LIBRARY_ORDER if lib in libs]
    for spec in specs:
        # Each file ends in `return {...}`: wrapped, its locals stay its own.
        parts.append(f"ALGOS[{spec.id}] = (function()\n{_lua(spec.lua)}end)()")
    parts.append(_lua(REQUEST_FILE))
    parts.append(_lua(DECIDE_FILE))
    return "\n".join(parts)


def decide_script(names: Iterable[str] | None = None) -> str:
    """lua/decide.lua with the named algorithms (all of them when None)."""
    chosen = frozenset(BY_NAME if names is None else names)
    unknown = chosen - BY_NAME.keys()
    if unknown:
        raise ValueError(f"unknown algorithms: {sorted(unknown)}")
    return _decide_script(chosen)


def verdict(res: list[Any]) -> Verdict:
    outcomes = [
        Outcome(bool(res[o]), bool(res[o + 1]), int(res[o + 2]), int(res[o + 3]), int(res[o + 4]))
        for o in range(1, len(res), 5)
    ]
    return Verdict(bool(res[0]), outcomes)


def lean_verdict(res: list[Any], checks: Sequence[Check]) -> Verdict:
    """Outcomes from lua/decide_fixed_window.lua's compact reply: {admitted, now, per check
    used * 4 + ok * 2 + charged}. Remaining and reset follow from the check and `now` exactly as
    fixed_window.lua computes them for a plain window (limit, no overdraft)."""
    now = int(res[1])
    outcomes = []
    for check, code in zip(checks, res[2:], strict=True):
        code = int(code)
        used, ok, charged = code >> 2, bool(code & 2), bool(code & 1)
        cap = check.limit.requests_per_unit
        window = check.limit.window_ms
        if charged:
            if check.flags & NEGATIVE:
                remaining = max(0, cap - max(0, used - check.hits))
            else:
                remaining = max(0, cap - used - check.hits)
        elif ok:
            remaining = max(0, cap - used)
        else:
            remaining = 0
        outcomes.append(Outcome(ok, charged, remaining, window - now % window, used))
    return Verdict(bool(res[0]), outcomes)
