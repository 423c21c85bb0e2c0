"""The domain-level `usage_stats` block (semantics in rls.core.usage)."""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rls.config.errors import ConfigError
from rls.config.yaml_source import as_list, as_str
from rls.core.usage import DistinctStat, UsageConfig


def parse_usage_stats(file: str, raw: Any) -> UsageConfig | None:
    """The domain-level `usage_stats` block (see rls.core.usage)."""
    if raw is None:
        return None

    def fail(message: str) -> ConfigError:
        return ConfigError(file, f"usage_stats: {message}")

    if not isinstance(raw, dict):
        raise fail("must be a map")
    unknown = set(raw) - {"days", "timezone", "calls", "distinct"}
    if unknown:
        raise fail(f"unknown key '{sorted(map(str, unknown))[0]}'")
    days = raw.get("days", 7)
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= 3660:
        raise fail("days must be a whole number from 1 to 3660")
    timezone = as_str(file, raw.get("timezone"), "timezone") or "UTC"
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise fail(f"unknown timezone '{timezone}'") from None

    def keys_of(value: Any, what: str) -> tuple[str, ...]:
        if isinstance(value, str):
            keys = tuple(k.strip() for k in value.split(",") if k.strip())
        elif isinstance(value, list) and all(isinstance(k, str) for k in value):
            keys = tuple(value)
        else:
            keys = ()
        if not keys:
            raise fail(f"{what} must be descriptor keys, e.g. 'app' or 'app,interface'")
        return keys

    calls = [keys_of(item, "calls entry") for item in as_list(file, raw.get("calls"), "calls")]
    distinct = []
    for item in as_list(file, raw.get("distinct"), "distinct"):
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise fail("distinct entries need a key, e.g. {key: user, per: app}")
        per = keys_of(item.get("per"), "distinct per") if item.get("per") is not None else ()
        distinct.append(DistinctStat(item["key"], per))
    if not calls and not distinct:
        raise fail("needs calls or distinct")
    return UsageConfig(days, timezone, calls, distinct)
