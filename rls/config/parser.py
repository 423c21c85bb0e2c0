"""Parse and validate one descriptor YAML document, with the reference service's conditions.

Validation mirrors envoyproxy/ratelimit (see reference/ratelimit-compat.md §1.3): a flat key
whitelist checked at any depth (metadata excepted), then typed checks. Messages are the
reference's so that operators grepping for them find the same text. Extensions of DESIGN §5
are validated here too.
"""

from __future__ import annotations

import re
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rls.config.errors import ConfigError
from rls.config.model import ALGORITHMS, MAX_WINDOW_SECONDS, UNIT_SECONDS, Level, Limit, Node, Unit
from rls.config.yaml_source import (
    YamlBool,
    as_bool,
    as_list,
    as_str,
    as_uint,
    render,
)
from rls.memo import BoundedCache

REFERENCE_KEYS = frozenset(
    {
        "domain",
        "key",
        "value",
        "descriptors",
        "rate_limit",
        "unit",
        "requests_per_unit",
        "unlimited",
        "shadow_mode",
        "quota_mode",
        "name",
        "replaces",
        "detailed_metric",
        "value_to_metric",
        "share_threshold",
        "metadata",
    }
)
EXTENSION_KEYS = frozenset(
    {
        "rate_limits",
        "algorithm",
        "unit_multiplier",
        "burst",
        "overdraft",
        "calendar",
        "timezone",
        "charge",
        "accept_releases",
        "usage_stats",
        "failure_mode",
    }
)
VALID_KEYS = REFERENCE_KEYS | EXTENSION_KEYS


def check_keys(file: str, obj: Any) -> None:
    """The reference's generic pass: every map key at any depth must be a whitelisted string."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str):
                raise ConfigError(file, f"config error, key is not of type string: {render(k)}")
            if k not in VALID_KEYS:
                raise ConfigError(file, f"config error, unknown key '{k}'")
            if k == "metadata":
                continue  # arbitrary user data, not validated (reference behaviour)
            if k == "usage_stats":
                continue  # validated by parse_usage_stats
            check_keys(file, v)
    elif isinstance(obj, list):
        for item in obj:
            if not isinstance(item, dict):
                raise ConfigError(
                    file,
                    f"config error, yaml file contains list of type other than map: {render(item)}",
                )
            check_keys(file, item)
    elif obj is None or isinstance(obj, (str, bool, int, YamlBool)):
        return
    else:
        raise ConfigError(file, "error checking config")


def parse_unit(text: str) -> Unit | None:
    try:
        unit = Unit[text.upper()]
    except KeyError:
        return None
    return None if unit is Unit.UNKNOWN else unit


class DomainParser:
    """Builds the node tree of one file into an existing domain root (merging allowed)."""

    def __init__(self, file: str, domain: str) -> None:
        self.file = file
        self.domain = domain

    def fail(self, message: str) -> ConfigError:
        return ConfigError(self.file, message)

    def add_descriptors(self, level: Level, items: Any, parent_path: str) -> None:
        for raw in as_list(self.file, items, "descriptors"):
            # Like the reference, a duplicate is reported before the node's own problems.
            key = as_str(self.file, raw.get("key"), "key")
            if key:
                self._check_duplicate(
                    level, key, as_str(self.file, raw.get("value"), "value"), parent_path
                )
            node = self._node(raw, parent_path)
            self._insert(level, node)

    def _check_duplicate(self, level: Level, key: str, value: str, parent_path: str) -> None:
        """Two nodes with the same key and value at one level (also across merged files).

        Unlike the reference, which compares the joined `key_value` string, the real pair is
        compared: `key: a, value: b_c` and `key: a_b, value: c` are different nodes here (the
        counter keys are injective too), while the reference rejects them as duplicates.
        """
        if value in level.by_key.get(key, ()):
            composite = f"{key}_{value}" if value else key
            raise self.fail(f"duplicate descriptor composite key '{parent_path}.{composite}'")

    def _insert(self, level: Level, node: Node) -> None:
        values = level.by_key.setdefault(node.key, {})
        values[node.value] = node
        level.ordered.append(node)
        if not node.value:
            level.defaults[node.key] = node
        elif "*" in node.value:
            level.wildcards.setdefault(node.key, []).append((wildcard_regex(node.value), node))

    def _node(self, raw: dict[str, Any], parent_path: str) -> Node:
        key = as_str(self.file, raw.get("key"), "key")
        if not key:
            raise self.fail("descriptor has empty key")
        value = as_str(self.file, raw.get("value"), "value")
        composite = f"{key}_{value}" if value else key
        path = f"{parent_path}.{composite}"
        share = as_bool(self.file, raw.get("share_threshold"), "share_threshold")
        if share and "*" not in value:
            raise self.fail(
                "share_threshold can only be used with wildcard values (containing '*'), "
                f"but found key '{composite}'"
            )
        metadata = raw.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise self.fail("error parsing metadata: metadata must be a map")
        node = Node(
            key=key,
            value=value,
            detailed_metric=as_bool(self.file, raw.get("detailed_metric"), "detailed_metric"),
            value_to_metric=as_bool(self.file, raw.get("value_to_metric"), "value_to_metric"),
            share_threshold=share,
            metadata=metadata,
            stats_part=composite,
        )
        shadow = as_bool(self.file, raw.get("shadow_mode"), "shadow_mode")
        quota = as_bool(self.file, raw.get("quota_mode"), "quota_mode")
        specs: list[Any] = []
        if raw.get("rate_limit") is not None:
            specs.append(raw["rate_limit"])
        specs.extend(as_list(self.file, raw.get("rate_limits"), "rate_limits"))
        limits = []
        for index, spec in enumerate(specs):
            if not isinstance(spec, dict):
                raise self.fail(
                    "error loading config file: yaml: unmarshal errors: rate_limit must be a map"
                )
            limits.append(self._limit(spec, path, shadow, quota, index))
        self._check_limit_set(limits, path)
        node.limits = tuple(limits)
        child_items = raw.get("descriptors")
        if child_items:
            node.children = Level()
            self.add_descriptors(node.children, child_items, path)
        return node

    def _check_limit_set(self, limits: list[Limit], path: str) -> None:
        if len(limits) > 1 and any(lim.unlimited for lim in limits):
            raise self.fail(f"'{path}': unlimited cannot be combined with other rate limits")
        seen: set[str] = set()
        for lim in limits:
            if lim.ident in seen:
                raise self.fail(
                    f"'{path}': two rate limits with the same algorithm and window; "
                    "give one a different unit, unit_multiplier or algorithm"
                )
            seen.add(lim.ident)

    def _limit(
        self, spec: dict[str, Any], path: str, shadow: bool, quota: bool, index: int
    ) -> Limit:
        f = self.file
        unlimited = as_bool(f, spec.get("unlimited"), "unlimited")
        unit_text = as_str(f, spec.get("unit"), "unit")
        unit = parse_unit(unit_text)
        if unlimited:
            if unit is not None:
                raise self.fail("should not specify rate limit unit when unlimited")
            unit = Unit.UNKNOWN
        elif unit is None:
            raise self.fail(f"invalid rate limit unit '{unit_text}'")
        name = as_str(f, spec.get("name"), "name")
        replaces: set[str] = set()
        for entry in as_list(f, spec.get("replaces"), "replaces"):
            rname = as_str(f, entry.get("name"), "name") if isinstance(entry, dict) else ""
            if not rname:
                raise self.fail("should not have an empty replaces entry")
            if rname == name:
                raise self.fail("replaces should not contain name of same descriptor")
            replaces.add(rname)
        algorithm = as_str(f, spec.get("algorithm"), "algorithm") or "fixed_window"
        if algorithm not in ALGORITHMS:
            raise self.fail(
                f"'{path}': unknown algorithm '{algorithm}' (one of {', '.join(ALGORITHMS)})"
            )
        multiplier = spec.get("unit_multiplier")
        multiplier = 1 if multiplier is None else as_uint(f, multiplier, "unit_multiplier")
        if multiplier < 1:
            raise self.fail(f"'{path}': unit_multiplier must be at least 1")
        if unit in UNIT_SECONDS and UNIT_SECONDS[unit] * multiplier > MAX_WINDOW_SECONDS:
            raise self.fail(f"'{path}': unit x unit_multiplier is longer than 100 years")
        burst = spec.get("burst")
        burst = None if burst is None else as_uint(f, burst, "burst")
        overdraft = as_uint(f, spec.get("overdraft"), "overdraft")
        calendar = as_bool(f, spec.get("calendar"), "calendar")
        timezone = as_str(f, spec.get("timezone"), "timezone") or "UTC"
        if spec.get("timezone") is not None:
            try:
                ZoneInfo(timezone)
            except (ZoneInfoNotFoundError, ValueError):
                raise self.fail(f"'{path}': unknown timezone '{timezone}'") from None
        self._check_extensions(path, algorithm, burst, overdraft, calendar, spec, unit, unlimited)
        rpu = as_uint(f, spec.get("requests_per_unit"), "requests_per_unit")
        if overdraft > rpu:
            raise self.fail(f"'{path}': overdraft must not exceed requests_per_unit")
        charge = as_str(f, spec.get("charge"), "charge") or "on_allow"
        if charge not in ("on_allow", "always"):
            raise self.fail(f"'{path}': charge must be 'on_allow' or 'always', not '{charge}'")
        if not unlimited and unit not in UNIT_SECONDS:
            raise self.fail(f"invalid rate limit unit '{unit_text}'")
        accept = spec.get("accept_releases")
        return Limit(
            requests_per_unit=rpu,
            unit=unit,
            name=name,
            unlimited=unlimited,
            shadow_mode=shadow,
            quota_mode=quota,
            replaces=frozenset(replaces),
            algorithm=algorithm,
            unit_multiplier=multiplier,
            burst=burst,
            overdraft=overdraft,
            calendar=calendar,
            timezone=timezone,
            charge_always=charge == "always",
            accept_releases=None if accept is None else as_bool(f, accept, "accept_releases"),
            full_key=path,
            index=index,
        )

    def _check_extensions(
        self,
        path: str,
        algorithm: str,
        burst: int | None,
        overdraft: int,
        calendar: bool,
        spec: dict[str, Any],
        unit: Unit | None,
        unlimited: bool,
    ) -> None:
        """Combinations of DESIGN §5 extensions that have no meaning are errors, not no-ops."""
        if unlimited:
            return
        if burst is not None and algorithm not in BURST_ALGORITHMS:
            raise self.fail(
                f"'{path}': burst applies to {', '.join(BURST_ALGORITHMS)}, not {algorithm}"
            )
        if overdraft and algorithm != "fixed_window":
            raise self.fail(f"'{path}': overdraft applies to fixed_window only")
        if calendar and algorithm != "fixed_window":
            raise self.fail(f"'{path}': calendar applies to fixed_window only")
        if spec.get("timezone") is not None and not calendar:
            raise self.fail(f"'{path}': timezone needs calendar: true")


BURST_ALGORITHMS = ("token_bucket", "leaky_bucket", "gcra")


# Patterns of every config ever loaded pass through here: bounded (rls.memo), LRU.
_WILDCARD_CACHE = BoundedCache("wildcard", 10_000, 8 << 20)


def wildcard_regex(pattern: str) -> re.Pattern[str]:
    """`*` matches zero or more characters, anywhere, any number of times; nothing else is magic."""
    compiled = _WILDCARD_CACHE.get(pattern)
    if compiled is None:
        body = ".*".join(re.escape(part) for part in pattern.split("*"))
        compiled = re.compile(body, re.DOTALL)
        _WILDCARD_CACHE.put(pattern, compiled, 4 * len(pattern) + 600)  # regex object ~ 4x
    return compiled
