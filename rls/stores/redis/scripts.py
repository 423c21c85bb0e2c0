"""Build the Redis Lua scripts from the files in lua/ (shipped in the wheel).

Redis runs a script's whole body on every EVALSHA, so a script that defined every algorithm
paid for all of them on every call. Scripts are instead built per request shape:
- `lean_script()`: every check a plain fixed window without flags, the common case
  (lua/decide_fixed_window.lua: one MGET, an INCRBY per charge; rls/stores/windows.py);
- `decide_script(names)`: lua/decide.lua with only the named algorithms and the libraries they
  use, so a request mixing algorithms is still one EVALSHA and atomic.
Each decide script starts with a prelude generated from the Python constants (flag bits,
GRACE_MS, fixed-window layouts),
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
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from importlib import resources
from typing import Any

import hiredis

from rls.core.algorithms.base import GRACE_MS
from rls.core.algorithms.registry import ALGORITHM_IDS, BY_NAME, REGISTRY
from rls.core.model import (
    CANDIDATE,
    CHARGE_ALWAYS,
    NEGATIVE,
    QUOTA,
    SHADOW,
    TWIN_SHIFT,
    Check,
    Outcome,
    Verdict,
)
from rls.stores.deadline import Deadline
from rls.stores.redis.clock import StoreClock
from rls.stores.windows import counts_in_window, expiry_ms, layout, store_key, window_bounds
from rls.stores.windows import lua_prelude as windows_prelude

LEAN_FILE = "decide_fixed_window.lua"
LEAN_BATCH_FILE = "decide_fixed_window_batch.lua"
DECIDE_FILE = "decide.lua"
REQUEST_FILE = "request.lua"  # now / mode / params, read by lua/decide.lua
LIBRARY_ORDER = ("values", "bucket_lib", "log_lib")  # a library may call the ones before it

# decide.lua's per-check parameters, little-endian doubles (exact for integers below 2^53):
# id, flags, hits, limit, window, burst, overdraft, window start, end, previous start (0 0 0
# for epoch windows of other layouts), fixed-window layout (rls/stores/windows.py).
CHECK = struct.Struct("<ddddddddddd")

# The lean batch: from this many plain fixed-window requests queued in one loop turn, they go to
# Redis as one EVALSHA (benchmarks/redis_batch.py: where it starts to pay), at most this many.
BATCH_MIN_DEPTH = 2
BATCH_MAX_ITEMS = 128

# Every Lua file a script can be built from (the wheel and the image must ship them all).
ALGORITHM_FILES: tuple[str, ...] = (
    *(f"{lib}.lua" for lib in LIBRARY_ORDER),
    *(spec.lua for spec in REGISTRY),
    REQUEST_FILE,
    LEAN_FILE,
    LEAN_BATCH_FILE,
)


def prelude() -> str:
    """Constants shared with Python, defined once there."""
    return (
        "local SHADOW, QUOTA, CHARGE_ALWAYS, NEGATIVE = "
        f"{SHADOW}, {QUOTA}, {CHARGE_ALWAYS}, {NEGATIVE}\n"
        f"local CANDIDATE, TWIN_DIV = {CANDIDATE}, {1 << TWIN_SHIFT}\n"
        f"local GRACE_MS = {GRACE_MS}\n"
        + windows_prelude()
    )


@cache
def _lua(name: str) -> str:
    return (resources.files("rls") / "lua" / name).read_text(encoding="utf-8")


@cache
def lean_script() -> str:
    return _lua(LEAN_FILE)  # needs no constant: no flags, no TIME


@cache
def lean_batch_script() -> str:
    return _lua(LEAN_BATCH_FILE)  # several lean requests in one EVALSHA (stores/redis/wire.py)


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


def request_args(
    checks: Sequence[Check], mode: str, now_ms: int | None, now: int
) -> tuple[int | None, list[Any]]:
    """(None, ARGV of the lean script) or (a bit per algorithm present, ARGV of lua/decide.lua)
    for this request; `now` is the time its windows are of, `now_ms` the caller's fixed time.

    Plain fixed windows without flags, decided or evaluated, take the lean script
    (lua/decide_fixed_window.lua: per check, the most its counter may hold, hits and the expiry
    of a new window key, as decimal arguments the script's arithmetic reads as they are).
    Anything else takes lua/decide.lua with the algorithms present, all of a check's numbers
    packed as 11 little-endian doubles in one argument (each argument costs the client an
    encoding step), and the script reads Redis TIME unless the caller fixes the time.
    """
    if mode in ("d", "e") and all(not c.flags and counts_in_window(c) for c in checks):
        room = [str(c.limit.requests_per_unit - max(c.hits, 1)) for c in checks]
        hits = [str(c.hits) for c in checks]
        ttl = [str(expiry_ms(c.limit.window_ms, now)) for c in checks]
        return None, [mode, *room, *hits, *ttl]
    mask = 0
    pack = CHECK.pack
    general = []
    for c in checks:
        lim = c.limit
        algorithm = ALGORITHM_IDS[lim.algorithm]
        mask |= 1 << algorithm
        if counts_in_window(c):
            start, stop, prev = window_bounds(lim.window_ms, now)
        else:
            start, stop, prev = c.bounds or (0, 0, 0)
        fw_layout = layout(c) if lim.algorithm == "fixed_window" else 0
        burst = lim.burst if lim.burst is not None else lim.requests_per_unit
        general.append(
            pack(algorithm, c.flags, c.hits, lim.requests_per_unit, lim.window_ms, burst,
                 lim.overdraft, start, stop, prev, fw_layout)
        )
    return mask, ["" if now_ms is None else str(now_ms), mode, b"".join(general)]


class LeanBatch:
    """How lean requests travel on the wire (rls/stores/redis/wire.py `Merger`): alone, one EVALSHA
    of lua/decide_fixed_window.lua; `min_depth` or more queued in one loop turn, one EVALSHA of
    lua/decide_fixed_window_batch.lua carrying them all (each still all-or-nothing, in order),
    which costs Redis less CPU per decision (benchmarks/redis_batch.py)."""

    def __init__(
        self,
        lean_sha: str,
        batch_sha: str,
        on_noscript: Callable[[], None],
        min_depth: int = BATCH_MIN_DEPTH,
        max_items: int = BATCH_MAX_ITEMS,
    ) -> None:
        self._lean = lean_sha.encode()
        self._batch = batch_sha.encode()
        self._on_noscript = on_noscript
        self.min_depth = min_depth
        self.max_items = max_items

    def one(self, keys: Sequence[Any], args: Sequence[Any]) -> bytes:
        packed: bytes = hiredis.pack_command((b"EVALSHA", self._lean, len(keys), *keys, *args))
        return packed

    def many(self, items: Sequence[tuple[Sequence[Any], Sequence[Any]]]) -> bytes:
        keys: list[Any] = []
        counts: list[int] = []
        args: list[Any] = []
        for k, a in items:
            keys += k
            counts.append(len(k))
            args += a
        packed: bytes = hiredis.pack_command(
            (b"EVALSHA", self._batch, len(keys), *keys, len(items), *counts, *args)
        )
        return packed

    def split(
        self, reply: list[Any], items: Sequence[tuple[Sequence[Any], Sequence[Any]]]
    ) -> list[Any]:
        parts = []
        at = 0
        for keys, _ in items:
            parts.append(reply[at:at + len(keys)])
            at += len(keys)
        return parts

    def failed(self, reply: Exception) -> None:
        if str(reply).startswith("NOSCRIPT"):
            self._on_noscript()


def verdict(res: list[Any]) -> Verdict:
    outcomes = [
        Outcome(bool(res[o]), bool(res[o + 1]), int(res[o + 2]), int(res[o + 3]), int(res[o + 4]))
        for o in range(1, len(res), 5)
    ]
    return Verdict(bool(res[0]), outcomes)


def lean_verdict(res: list[Any], checks: Sequence[Check], mode: str, now_ms: int) -> Verdict:
    """Outcomes from lua/decide_fixed_window.lua's reply: the counters as the script read them
    (None: no key yet). The script charged every check if and only if each had room and the
    mode was 'd', so the admission and every number follow from the counters and the checks,
    as lua/fixed_window.lua computes them for a window without flags; the windows are the ones
    the keys were chosen for (`now_ms`)."""
    used = [int(v) if v is not None else 0 for v in res]
    oks = [
        u + max(c.hits, 1) <= c.limit.requests_per_unit
        for u, c in zip(used, checks, strict=True)
    ]
    admitted = all(oks)
    charged = admitted and mode == "d"
    outcomes = []
    for check, u, ok in zip(checks, used, oks, strict=True):
        cap = check.limit.requests_per_unit
        window = check.limit.window_ms
        if charged:
            remaining = max(0, cap - u - check.hits)
        elif ok:
            remaining = max(0, cap - u)
        else:
            remaining = 0
        outcomes.append(Outcome(ok, charged, remaining, window - now_ms % window, u))
    return Verdict(admitted, outcomes)


class ScriptBook:
    """One client's registered scripts: the lean script, its batch form, and one script per
    mix of algorithms built on first use (at most 2^len(REGISTRY), a bit per algorithm)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.lean = client.register_script(lean_script())
        self.lean_batch = client.register_script(lean_batch_script())
        self._mixes: dict[int, Any] = {}

    def mix(self, mask: int) -> Any:
        """The script for the algorithms whose bits are set in `mask`, registered once."""
        script = self._mixes.get(mask)
        if script is None:
            names = [spec.name for spec in REGISTRY if mask & (1 << spec.id)]
            script = self._mixes[mask] = self.client.register_script(decide_script(names))
        return script

    def preloaded(self, algorithms: Iterable[str]) -> list[Any]:
        """The scripts to SCRIPT LOAD before a process says it is ready: the lean ones and
        the single-algorithm script of each named algorithm (any other mix loads on first
        use: EVALSHA answers NOSCRIPT once and it is loaded)."""
        return [self.lean, self.lean_batch,
                *(self.mix(1 << BY_NAME[name].id) for name in algorithms)]

    def args(
        self, checks: Sequence[Check], now_ms: int | None, mode: str, store_now: Callable[[], int]
    ) -> tuple[Any, list[str], list[Any], int]:
        """The script for this request, its KEYS, its ARGV (`request_args`), and the time its
        windows are of: `now_ms` when the caller fixes the time, else the store's clock
        (other algorithms then read Redis TIME in the script)."""
        now = store_now() if now_ms is None else now_ms
        keys = [store_key(c, now) for c in checks]
        mask, args = request_args(checks, mode, now_ms, now)
        return (self.lean if mask is None else self.mix(mask)), keys, args, now

    def verdict(
        self, script: Any, res: list[Any], checks: Sequence[Check], mode: str, now: int
    ) -> Verdict:
        if script is self.lean:
            return lean_verdict(res, checks, mode, now)
        return verdict(res)


class ScriptRunner(ABC):
    """What both Redis topologies share: one request's script call, read as a Verdict. Each
    topology says how a script is evaluated (the wire or redis-py; per slot on a Cluster)."""

    book: ScriptBook
    clock: StoreClock

    @abstractmethod
    async def eval(
        self, script: Any, keys: Sequence[Any], args: Sequence[Any],
        deadline: Deadline | None = None,
    ) -> Any: ...

    async def run(
        self, checks: Sequence[Check], now_ms: int | None, mode: str,
        deadline: Deadline | None = None,
    ) -> Verdict:
        book = self.book
        script, keys, args, now = book.args(checks, now_ms, mode, self.clock.now_ms)
        res = await self.eval(script, keys, args, deadline)
        return book.verdict(script, res, checks, mode, now)
