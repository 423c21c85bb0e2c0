"""Usage statistics: calls per day per descriptor prefix, distinct values per day.

Opt-in per domain:

    usage_stats:
      days: 30                      # kept this many days (default 7)
      timezone: Asia/Shanghai       # where a day starts (default UTC)
      calls: ["app", "app,interface"]
      distinct: [{key: user, per: "app"}]

A request adds 1 to `calls` for every listed key set that one of its descriptors contains
(once per request, whatever the number of descriptors), and its `key` value to the distinct
set of the `per` keys' values. Redis keeps distinct sets as HyperLogLogs (~0.8 % standard
error, 12 KB at most per set); the memory backend keeps exact sets. The operations ride in the
decision's round trip (pipelined with the EVALSHA). All calls are counted, admitted or not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from zoneinfo import ZoneInfo

from rls.core.keys import counter_key

# (kind, key, member): kind "c" adds 1 to a daily counter, "h" adds member to a daily set.
UsageOp = tuple[str, str, str]


@dataclass(slots=True, frozen=True)
class DistinctStat:
    key: str
    per: tuple[str, ...]


@dataclass(slots=True)
class UsageConfig:
    days: int = 7
    timezone: str = "UTC"
    calls: list[tuple[str, ...]] = field(default_factory=list)
    distinct: list[DistinctStat] = field(default_factory=list)

    @property
    def ttl_ms(self) -> int:
        return (self.days + 1) * 86_400_000


def day_of(now_ms: int, timezone: str) -> str:
    return datetime.fromtimestamp(now_ms / 1000, ZoneInfo(timezone)).strftime("%Y%m%d")


def calls_key(
    prefix: str, domain: str, day: str, parts: Sequence[tuple[str, str]], key_hash: str = ""
) -> str:
    """`key_hash`: the domain's (rls.core.keys), like its rate-limit counters."""
    return counter_key(prefix, domain, parts, f"u{day}", key_hash)


def distinct_key(
    prefix: str,
    domain: str,
    day: str,
    key: str,
    parts: Sequence[tuple[str, str]],
    key_hash: str = "",
) -> str:
    return counter_key(prefix, domain, [*parts, ("#distinct", key)], f"h{day}", key_hash)


def usage_ops(
    config: UsageConfig,
    prefix: str,
    domain: str,
    descriptors: Sequence[Sequence[tuple[str, str]]],
    now_ms: int,
    key_hash: str = "",
) -> list[UsageOp]:
    day = day_of(now_ms, config.timezone)
    ops: dict[UsageOp, None] = {}  # ordered and de-duplicated within the request
    for entries in descriptors:
        values = dict(entries)
        for keys in config.calls:
            if all(k in values for k in keys):
                parts = [(k, values[k]) for k in keys]
                ops[("c", calls_key(prefix, domain, day, parts, key_hash), "")] = None
        for stat in config.distinct:
            if stat.key in values and all(k in values for k in stat.per):
                parts = [(k, values[k]) for k in stat.per]
                key = distinct_key(prefix, domain, day, stat.key, parts, key_hash)
                ops[("h", key, values[stat.key])] = None
    return list(ops)
