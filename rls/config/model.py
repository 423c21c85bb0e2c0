"""Immutable, compiled view of the descriptor config.

The loader turns YAML into these objects once per (re)load; the request path only reads them,
so everything the hot path needs (window length, stats key, replaces set) is precomputed here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from rls.memo import MATCH_MEMO_BYTES, MATCH_MEMO_ENTRIES, BoundedCache


class Unit(IntEnum):
    """Numbering of envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit."""

    UNKNOWN = 0
    SECOND = 1
    MINUTE = 2
    HOUR = 3
    DAY = 4
    MONTH = 5
    YEAR = 6
    WEEK = 7


# Window lengths of the reference service: MONTH is 30 days and YEAR 365 days, epoch aligned.
UNIT_SECONDS: dict[Unit, int] = {
    Unit.SECOND: 1,
    Unit.MINUTE: 60,
    Unit.HOUR: 3600,
    Unit.DAY: 86400,
    Unit.WEEK: 604800,
    Unit.MONTH: 2592000,
    Unit.YEAR: 31536000,
}

# Longest window a limit may have (unit x unit_multiplier): 100 years. Keeps every time value
# well inside exact float and int64 range on both backends.
MAX_WINDOW_SECONDS = 100 * 365 * 86400

ALGORITHMS = (
    "fixed_window",
    "sliding_window",
    "sliding_log",
    "token_bucket",
    "leaky_bucket",
    "gcra",
    "concurrency",
)


@dataclass(slots=True, eq=False)
class Limit:
    """One rate limit as configured on a descriptor node (or built from a request override).

    `ident` is the stable part of the counter key that says which limit this is (algorithm and
    window); changing either starts a fresh counter instead of misreading old state.
    """

    requests_per_unit: int
    unit: Unit
    name: str = ""
    unlimited: bool = False
    shadow_mode: bool = False
    quota_mode: bool = False
    replaces: frozenset[str] = frozenset()
    algorithm: str = "fixed_window"
    unit_multiplier: int = 1
    burst: int | None = None
    overdraft: int = 0
    calendar: bool = False
    timezone: str = "UTC"
    charge_always: bool = False
    # Whether is_negative_hits may give hits back (YAML `accept_releases`); None = only for
    # `concurrency`, whose leases are released that way. Elsewhere a release is ignored: any
    # caller could otherwise zero any counter with one huge negative addend.
    accept_releases: bool | None = None
    # Config path for metrics, e.g. "domain.key1_value1.subkey1" (reference stats key).
    full_key: str = ""
    index: int = 0
    ident: str = ""
    window_ms: int = 0
    # Per-limit metric children, attached lazily by rls.metrics (kept here to avoid lookups).
    stats: Any = None
    # "limit,window ms,burst,overdraft": this limit's part of the Redis script parameters.
    script_params: str = ""

    def __post_init__(self) -> None:
        if self.accept_releases is None:
            self.accept_releases = self.algorithm == "concurrency"
        if self.unit in UNIT_SECONDS:
            self.window_ms = UNIT_SECONDS[self.unit] * 1000 * max(1, self.unit_multiplier)
        burst = self.burst if self.burst is not None else self.requests_per_unit
        self.script_params = (
            f"{self.requests_per_unit},{self.window_ms},{burst},{self.overdraft}"
        )
        if not self.ident:
            self.ident = f"{_ALGO_TAG[self.algorithm]}{self.window_ms // 1000}"
            if self.calendar:
                self.ident += f"c{self.timezone}"
            if self.index:
                self.ident += f"i{self.index}"

    @property
    def window_seconds(self) -> int:
        return self.window_ms // 1000


_ALGO_TAG = {
    "fixed_window": "f",
    "sliding_window": "s",
    "sliding_log": "l",
    "token_bucket": "t",
    "leaky_bucket": "k",
    "gcra": "g",
    "concurrency": "c",
}


@dataclass(slots=True, eq=False)
class Node:
    """A descriptor node: one level of the tree, matched against one request entry."""

    key: str
    value: str  # "" for the key-only default node
    limits: tuple[Limit, ...] = ()
    children: Level | None = None
    detailed_metric: bool = False
    value_to_metric: bool = False
    share_threshold: bool = False
    metadata: dict[str, Any] | None = None
    # Reference stats-key fragment of this level when matched the ordinary way.
    stats_part: str = ""


@dataclass(slots=True, eq=False)
class Level:
    """Children of one node (or the domain root), indexed for the reference matching order."""

    by_key: dict[str, dict[str, Node]] = field(default_factory=dict)
    wildcards: dict[str, list[tuple[re.Pattern[str], Node]]] = field(default_factory=dict)
    defaults: dict[str, Node] = field(default_factory=dict)
    ordered: list[Node] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class Domain:
    name: str
    root: Level
    files: list[str] = field(default_factory=list)
    failure_mode: str | None = None  # allow | deny when the backend fails; None = global
    usage: Any = None  # rls.engine.usage.UsageConfig when usage_stats is configured
    # Match results by request entries, filled by the limiter; a reload builds new Domains,
    # so the memo never outlives the config it was computed from. Bounded in bytes (rls.memo).
    memo: BoundedCache = field(default_factory=lambda: BoundedCache(
        "match", MATCH_MEMO_ENTRIES, MATCH_MEMO_BYTES))


@dataclass(slots=True, eq=False)
class RateLimitConfig:
    """The whole loaded config: domains by name, plus where each came from."""

    domains: dict[str, Domain] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    # rls.config.errors.ConfigWarning: loads, but probably a mistake (an error with --strict)
    warnings: list[Any] = field(default_factory=list)

    def all_limits(self) -> list[Limit]:
        out: list[Limit] = []

        def walk(level: Level) -> None:
            for node in level.ordered:
                out.extend(node.limits)
                if node.children is not None:
                    walk(node.children)

        for domain in self.domains.values():
            walk(domain.root)
        return out
