"""Counter items, their validation, their windows and their store keys.

An item names a counter (domain, key) and a window (time_span x time_unit, calendar-aligned or
rolling from the first hit). Calendar windows of natural units (day, week, month) follow an
IANA time zone; their bounds are computed here from a clock but the store picks the window
containing *its* time among the candidates (see stores.py), so replicas with skewed clocks
agree at midnight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import MINYEAR, date
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml

from rls.config.errors import ConfigError
from rls.config.loader import read_text
from rls.config.model import Unit
from rls.config.yaml_source import parse_yaml
from rls.core.keys import KEY_HASHES as _DIGESTS
from rls.core.keys import digest, key_hash_problem
from rls.core.limits import WINDOW_ROLLING
from rls.engine.calendar import calendar_window

MAX_BATCH = 30
MAX_DOMAIN_BYTES = 128
MAX_KEY_BYTES = 1024
MAX_SPAN = 1_000_000
MAX_HITS = 1_000_000_000
MAX_LISTING = 1000  # counters one /v1/counters/list answer shows

UNITS: dict[str, Unit] = {
    "second": Unit.SECOND,
    "minute": Unit.MINUTE,
    "hour": Unit.HOUR,
    "day": Unit.DAY,
    "week": Unit.WEEK,
    "month": Unit.MONTH,
}
# Letters used in store keys (stable: changing one orphans counters).
_UNIT_LETTER = {
    Unit.SECOND: "s", Unit.MINUTE: "m", Unit.HOUR: "h", Unit.DAY: "D", Unit.WEEK: "W",
    Unit.MONTH: "M",
}
# Rolling windows need a fixed length; a "rolling month" has none, so it is refused.
_FIXED_MS = {
    Unit.SECOND: 1000, Unit.MINUTE: 60_000, Unit.HOUR: 3_600_000, Unit.DAY: 86_400_000,
    Unit.WEEK: 604_800_000,
}
# The longest span per unit. Calendar windows of N days/weeks/months are blocks counted from
# 1970-01-01 (weeks: Monday 1969-12-29), and a call computes the window before the current one
# too: for N beyond the days since 1970 that is the block starting N units before 1970, which
# must still be a date Python can represent (year >= MINYEAR). Rolling windows of the same
# unit share the bound (one rule per unit). Seconds to hours are plain epoch arithmetic.
_FIRST_DAY = date(MINYEAR, 1, 1)
MAX_SPANS: dict[Unit, int] = {
    Unit.SECOND: MAX_SPAN,
    Unit.MINUTE: MAX_SPAN,
    Unit.HOUR: MAX_SPAN,
    Unit.DAY: (date(1970, 1, 1) - _FIRST_DAY).days,  # 719,162
    Unit.WEEK: (date(1969, 12, 29) - _FIRST_DAY).days // 7,  # 102,737
    Unit.MONTH: (1970 - MINYEAR) * 12,  # 23,628
}
WINDOWS = ("calendar", WINDOW_ROLLING)
KEY_HASHES = ("", *_DIGESTS)


class InvalidItem(ValueError):
    """The caller sent something that cannot be counted; a batch holding one fails whole."""


@dataclass(frozen=True, slots=True)
class DomainOptions:
    timezone: str = "UTC"
    key_hash: str = ""  # "" (keys as given), "md5" or "xxh3": fixed-length store keys


@dataclass(slots=True)
class CountersConfig:
    """`--counters-config` YAML. Unknown domains use `default_timezone` and no hashing."""

    default_timezone: str = "UTC"
    domains: dict[str, DomainOptions] = field(default_factory=dict)
    stale_max_entries: int = 100_000
    stale_max_bytes: int = 32 << 20
    hot_top_n: int = 100
    hot_threshold: float = 50.0  # Gets per second of one counter before it is cached
    hot_ttl_ms: int = 1000  # at most 1000
    # Store time of one Add/Get/batch call, queueing in this process included. Generous: a
    # timed-out Add is ambiguous (it may have been applied), which callers cannot retry safely.
    timeout_ms: int = 1000

    def options(self, domain: str) -> DomainOptions:
        found = self.domains.get(domain)
        return found if found is not None else DomainOptions(self.default_timezone)


def _zone_ok(name: str) -> bool:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


# The top-level fields of a counters config file (`--counters-config`).
FIELDS = frozenset({"default_timezone", "domains", "stale_cache", "hot_keys", "timeout_ms"})


def is_counters_doc(doc: Any) -> bool:
    """Whether a parsed YAML document is a counters config rather than a descriptor file (no
    `domain` or `descriptors`, some counters field): how `rls check-config` tells them apart."""
    return (isinstance(doc, dict) and not {"domain", "descriptors"} & set(doc)
            and bool(FIELDS & set(doc)))


def load_config(path: str) -> CountersConfig:
    """Read and check the counters YAML; raises ValueError with `file: message`."""
    try:  # regular files only, within the descriptor loader's size, node and depth budgets
        text = read_text(path)
        parse_yaml(path, text)
        raw = yaml.safe_load(text) or {}
    except ConfigError as exc:
        raise ValueError(exc.detail(" | ")) from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: must be a mapping")
    unknown = set(raw) - FIELDS
    if unknown:
        raise ValueError(f"{path}: unknown fields {sorted(unknown)}")
    cfg = CountersConfig()
    cfg.default_timezone = str(raw.get("default_timezone", "UTC"))
    if not _zone_ok(cfg.default_timezone):
        raise ValueError(f"{path}: unknown time zone {cfg.default_timezone!r}")
    for name, opts in (raw.get("domains") or {}).items():
        opts = opts or {}
        if not isinstance(opts, dict) or set(opts) - {"timezone", "key_hash"}:
            raise ValueError(f"{path}: domain {name!r}: fields are timezone, key_hash")
        tz = str(opts.get("timezone", cfg.default_timezone))
        if not _zone_ok(tz):
            raise ValueError(f"{path}: domain {name!r}: unknown time zone {tz!r}")
        key_hash = str(opts.get("key_hash") or "")
        problem = key_hash_problem(key_hash) if key_hash else None
        if problem is not None:
            raise ValueError(f"{path}: domain {name!r}: {problem}")
        cfg.domains[str(name)] = DomainOptions(tz, key_hash)
    stale = raw.get("stale_cache") or {}
    cfg.stale_max_entries = int(stale.get("max_entries", cfg.stale_max_entries))
    cfg.stale_max_bytes = int(stale.get("max_bytes", cfg.stale_max_bytes))
    hot = raw.get("hot_keys") or {}
    cfg.hot_top_n = int(hot.get("top_n", cfg.hot_top_n))
    cfg.hot_threshold = float(hot.get("threshold_per_second", cfg.hot_threshold))
    cfg.hot_ttl_ms = int(hot.get("ttl_ms", cfg.hot_ttl_ms))
    if not 0 <= cfg.hot_ttl_ms <= 1000:
        raise ValueError(f"{path}: hot_keys.ttl_ms must be 0..1000")
    cfg.timeout_ms = int(raw.get("timeout_ms", cfg.timeout_ms))
    return cfg


@dataclass(slots=True)
class Item:
    """One validated counter operation (treat as immutable; `_key` memoizes base_key)."""

    domain: str
    key: str
    span: int
    unit: Unit
    hits: int
    timezone: str
    rolling: bool
    key_hash: str = ""
    _key: tuple[str, str] | None = field(default=None, compare=False, repr=False)

    @property
    def ident(self) -> str:
        """The counter's identity apart from the window instance (caches, pub/sub)."""
        return self.base_key("")

    @property
    def rolling_ms(self) -> int:
        return _FIXED_MS[self.unit] * self.span

    def base_key(self, prefix: str) -> str:
        """`{prefix}c{<tag>}` where the tag is injective: lengths before variable parts.

        The braces make the tag Redis Cluster's hash tag, so the window suffix the script
        appends (`:<start ms>` or `:r`) stays in the slot of the declared key.
        """
        memo = self._key
        if memo is not None and memo[0] == prefix:
            return memo[1]
        key = digest(self.key_hash, self.key) if self.key_hash else self.key
        tz = "" if self.rolling else self.timezone
        window = "r" if self.rolling else "c"
        domain = self.domain
        base = (
            f"{prefix}c{{{len(domain.encode())}:{domain}:{self.key_hash or '-'}"
            f"{len(key.encode())}:{key}:{self.span}{_UNIT_LETTER[self.unit]}{window}:{tz}}}"
        )
        self._key = (prefix, base)
        return base

    def bounds(self, now_ms: int) -> list[int]:
        """Four window edges around `now_ms`: the previous, current and next windows.

        The store picks the one containing its own time; a clock within one window of the
        store's therefore never decides which window counts.
        """
        return window_bounds(now_ms, self.unit, self.span, self.timezone)


def original_key(store_key: bytes, prefix: str) -> str | None:
    """The counted key inside a store key written without `key_hash` (see Item.base_key: the
    key is part of it, after its byte length); None for a hashed key (its original is stored
    with the counter) or for a key of another shape."""
    head = f"{prefix}c{{".encode()
    if not store_key.startswith(head):
        return None
    pos = len(head)
    try:
        colon = store_key.index(b":", pos)
        pos = colon + 1 + int(store_key[pos:colon])  # past the domain
        if store_key[pos : pos + 2] != b":-":
            return None  # hashed: `:md5…` / `:xxh3…`
        pos += 2
        colon = store_key.index(b":", pos)
        end = colon + 1 + int(store_key[pos:colon])
    except ValueError:
        return None
    if store_key[end : end + 1] != b":":
        return None
    return store_key[colon + 1 : end].decode("utf-8", "backslashreplace")


_BOUNDS: dict[tuple[Unit, int, str], list[int]] = {}


def window_bounds(now_ms: int, unit: Unit, span: int, timezone: str) -> list[int]:
    """Cached per (unit, span, zone) until `now_ms` leaves the current window: zone arithmetic
    costs ~50 µs, a batch of 30 would spend 1.5 ms on it."""
    ident = (unit, span, timezone)
    found = _BOUNDS.get(ident)
    if found is not None and found[1] <= now_ms < found[2]:
        return found
    start, end = calendar_window(now_ms, unit, span, timezone)
    prev, _ = calendar_window(start - 1, unit, span, timezone)
    _, after = calendar_window(end, unit, span, timezone)
    if len(_BOUNDS) > 4096:
        _BOUNDS.clear()
    result = _BOUNDS[ident] = [prev, start, end, after]
    return result


def _text(value: Any, name: str, max_bytes: int) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidItem(f"{name} must be a non-empty string")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate (JSON "\ud800"): no store can keep it
        raise InvalidItem(f"{name} must be valid Unicode (it holds a lone surrogate)") from None
    if size > max_bytes:
        raise InvalidItem(f"{name} longer than {max_bytes} bytes")
    return value


def _int(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidItem(f"{name} must be an integer")
    if not low <= value <= high:
        raise InvalidItem(f"{name} must be in {low}..{high}")
    return value


def make_item(
    cfg: CountersConfig,
    domain: Any,
    key: Any,
    time_span: Any,
    time_unit: Any,
    hits: Any = 1,
    timezone: Any = "",
    window: Any = "calendar",
) -> Item:
    """Validate one operation; raises InvalidItem naming the first bad field."""
    domain = _text(domain, "domain", MAX_DOMAIN_BYTES)
    key = _text(key, "key", MAX_KEY_BYTES)
    if not isinstance(time_unit, str) or time_unit.lower() not in UNITS:
        raise InvalidItem(f"time_unit must be one of {', '.join(UNITS)}")
    unit = UNITS[time_unit.lower()]
    span = _int(time_span, f"time_span of a {unit.name.lower()} window", 1, MAX_SPANS[unit])
    hits = _int(hits, "hits", 0, MAX_HITS) or 1
    if window not in WINDOWS:
        raise InvalidItem(f"window must be one of {', '.join(WINDOWS)}")
    rolling = window == WINDOW_ROLLING
    if rolling and unit not in _FIXED_MS:
        raise InvalidItem("window rolling_from_first_hit needs a fixed-length unit (not month)")
    options = cfg.options(domain)
    tz = options.timezone
    if timezone:
        if not isinstance(timezone, str) or not _zone_ok(timezone):
            raise InvalidItem(f"unknown time zone {str(timezone)[:64]!r}")
        tz = timezone
    return Item(domain, key, span, unit, hits, tz, rolling, options.key_hash)


def item_from_json(cfg: CountersConfig, body: Any) -> Item:
    if not isinstance(body, dict):
        raise InvalidItem("each item must be a JSON object")
    allowed = {"domain", "appid", "key", "time_span", "time_unit", "hits", "timezone", "window"}
    unknown = set(body) - allowed
    if unknown:
        raise InvalidItem(f"unknown fields {sorted(unknown)}")
    return make_item(
        cfg,
        body.get("domain", body.get("appid")),
        body.get("key"),
        body.get("time_span", 1),
        body.get("time_unit"),
        body.get("hits", 1),
        body.get("timezone", ""),
        body.get("window", "calendar"),
    )


@dataclass(slots=True)
class Result:
    """What one item answers. `code`: ok | invalid | unavailable."""

    code: str = "ok"
    message: str = ""
    freq: int = 0
    ttl_ms: int = 0
    stale: bool = False

    @property
    def ttl(self) -> int:
        """Seconds left in the window, rounded up (1 ms left is 1 s, not 0)."""
        return -(-max(self.ttl_ms, 0) // 1000)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "freq": self.freq, "ttl": self.ttl}
        if self.message:
            out["message"] = self.message
        if self.stale:
            out["stale"] = True
        return out
