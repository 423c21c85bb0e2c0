"""How Redis stores a fixed window: the layouts shared with lua/fixed_window.lua, defined once.

A plain fixed window (epoch-aligned, no overdraft, not rolling, no calendar: `counts_in_window`)
keeps its usage as a plain integer in a key of its own window, `<counter key>@<window index>`,
like envoyproxy/ratelimit's `..._<window start>` keys. A check then costs Redis one read and
its charge one INCRBY: no window start to compare, no value to parse or format, no TIME call.
The client picks the window on the store's clock (rls/stores/redis/clock.py), so replicas agree on
it; a replica a little off only writes its last or first hits of a window into the neighbour
window's key, and a key never holds more than its limit, whatever the clocks.

Every other fixed window keeps "<window start ms>:<usage>:<debt>" in a key that outlives
windows (overdraft reads the previous window, a rolling window's start is its first hit, a
calendar window's bounds come with the check).
"""

from __future__ import annotations

from rls.core.algorithms.base import GRACE_MS
from rls.core.limits import Limit
from rls.core.model import Check

# lua/fixed_window.lua's `a.layout` (the 11th number of a check in lua/decide.lua).
FW_ALIGNED = 0  # "<start>:<usage>:<debt>", epoch or calendar bounds, overdraft
FW_ROLLING = 1  # "<start>:<usage>:<debt>", start = the key's first charge
FW_COUNTER = 2  # a plain integer in the window's own key


def plain_window(limit: Limit) -> bool:
    """An epoch-aligned fixed window: no overdraft, not rolling, not calendar."""
    return limit.plain


def counts_in_window(check: Check) -> bool:
    """Whether this check's counter is a plain integer in its window's own key (FW_COUNTER);
    a check with bounds of its own (calendar, quota ledgers) keeps them in its value."""
    return check.bounds is None and plain_window(check.limit)


def layout(check: Check) -> int:
    """The FW_* layout of a fixed-window check."""
    if counts_in_window(check):
        return FW_COUNTER
    return FW_ROLLING if check.limit.rolling else FW_ALIGNED


def window_key(key: str, window_ms: int, now_ms: int) -> str:
    """The key of the window holding `now_ms`. Injective: a counter key ends in its limit
    ident (rls/core/keys.py), never in `@<digits>`."""
    return f"{key}@{now_ms // window_ms}"


def store_key(check: Check, now_ms: int) -> str:
    """The Redis key of a check's counter at `now_ms`: a plain fixed window's own window key,
    else the counter key."""
    if counts_in_window(check):
        return window_key(check.key, check.limit.window_ms, now_ms)
    return check.key


def window_bounds(window_ms: int, now_ms: int) -> tuple[int, int, int]:
    """(start, end, previous start) of the epoch window holding `now_ms`."""
    start = now_ms - now_ms % window_ms
    return start, start + window_ms, start - window_ms


def expiry_ms(window_ms: int, now_ms: int) -> int:
    """PX of a window key created at `now_ms`: to its window's end, plus slack for a replica
    whose clock runs a little behind."""
    return window_ms - now_ms % window_ms + GRACE_MS


def lua_prelude() -> str:
    return f"local FW_ROLLING, FW_COUNTER = {FW_ROLLING}, {FW_COUNTER}"
