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

import yaml

from rls.config.errors import ConfigError
from rls.config.model import ALGORITHMS, UNIT_SECONDS, Level, Limit, Node, Unit
from rls.engine.usage import DistinctStat, UsageConfig

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
        "usage_stats",
        "failure_mode",
    }
)
VALID_KEYS = REFERENCE_KEYS | EXTENSION_KEYS
UINT32_MAX = 4294967295


class YamlInt(int):
    """An int that remembers its source text.

    The reference's YAML library keeps a scalar's text when the target field is a string, so
    `value: 007` stays "007" (not 7) and `value: yes` stays "yes" (not true).
    """

    raw: str


class YamlBool:
    """A YAML 1.1 boolean (`true`, `yes`, `Off`…) that remembers its source text."""

    __slots__ = ("raw", "value")

    def __init__(self, value: bool, raw: str) -> None:
        self.value = value
        self.raw = raw

    def __bool__(self) -> bool:
        return self.value

    def __repr__(self) -> str:
        return self.raw


class _Loader(yaml.SafeLoader):
    """SafeLoader resolving scalars like the reference's yaml.v2: timestamps stay strings,
    `1e3` is a float, and ints and bools keep their text for string fields."""

    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:  # type: ignore[override]
        value = YamlInt(super().construct_yaml_int(node))
        value.raw = node.value
        return value

    def construct_yaml_bool(self, node: yaml.ScalarNode) -> YamlBool:  # type: ignore[override]
        return YamlBool(super().construct_yaml_bool(node), node.value)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:bool", _Loader.construct_yaml_bool)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9]+[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def parse_yaml(file: str, text: str) -> Any:
    """First YAML document of `text` (the reference reads only the first)."""
    try:
        for doc in yaml.load_all(text, Loader=_Loader):  # a SafeLoader subclass
            return doc
        return None
    except yaml.YAMLError as exc:
        raise ConfigError(file, f"error loading config file: {_yaml_error(exc)}") from None


def _yaml_error(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is not None:
        return f"yaml: line {mark.line + 1}: {problem}"
    return f"yaml: {problem}"


def check_keys(file: str, obj: Any) -> None:
    """The reference's generic pass: every map key at any depth must be a whitelisted string."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str):
                raise ConfigError(file, f"config error, key is not of type string: {_render(k)}")
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
                    "config error, yaml file contains list of type other than map: "
                    f"{_render(item)}",
                )
            check_keys(file, item)
    elif obj is None or isinstance(obj, (str, bool, int, YamlBool)):
        return
    else:
        raise ConfigError(file, "error checking config")


def _render(value: Any) -> str:
    if isinstance(value, (YamlBool, YamlInt)):
        return value.raw
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    return str(value)


def as_str(file: str, value: Any, field: str) -> str:
    if value is None:
        return ""
    if isinstance(value, (YamlInt, YamlBool)):
        return value.raw
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int)):
        return str(value)
    raise ConfigError(
        file, f"error loading config file: yaml: unmarshal errors: cannot unmarshal {field}"
    )


def _as_bool(file: str, value: Any, field: str) -> bool:
    if value is None:
        return False
    if isinstance(value, YamlBool):
        return value.value
    if isinstance(value, bool):
        return value
    raise ConfigError(
        file,
        "error loading config file: yaml: unmarshal errors: "
        f"cannot unmarshal {_render(value)!r} into bool field '{field}'",
    )


def _as_uint(file: str, value: Any, field: str, maximum: int = UINT32_MAX) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise ConfigError(
            file,
            "error loading config file: yaml: unmarshal errors: "
            f"cannot unmarshal {_render(value)!r} into unsigned integer field '{field}'",
        )
    return value


def _as_list(file: str, value: Any, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(
            file,
            "error loading config file: yaml: unmarshal errors: "
            f"cannot unmarshal {type(value).__name__} into list field '{field}'",
        )
    return value


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
        for raw in _as_list(self.file, items, "descriptors"):
            node = self._node(raw, parent_path)
            self._insert(level, node, parent_path)

    def _insert(self, level: Level, node: Node, parent_path: str) -> None:
        composite = f"{node.key}_{node.value}" if node.value else node.key
        values = level.by_key.setdefault(node.key, {})
        if node.value in values or (not node.value and node.key in level.defaults):
            raise self.fail(
                f"duplicate descriptor composite key '{parent_path}.{composite}'"
            )
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
        share = _as_bool(self.file, raw.get("share_threshold"), "share_threshold")
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
            detailed_metric=_as_bool(self.file, raw.get("detailed_metric"), "detailed_metric"),
            value_to_metric=_as_bool(self.file, raw.get("value_to_metric"), "value_to_metric"),
            share_threshold=share,
            metadata=metadata,
            stats_part=composite,
        )
        shadow = _as_bool(self.file, raw.get("shadow_mode"), "shadow_mode")
        quota = _as_bool(self.file, raw.get("quota_mode"), "quota_mode")
        specs: list[Any] = []
        if raw.get("rate_limit") is not None:
            specs.append(raw["rate_limit"])
        specs.extend(_as_list(self.file, raw.get("rate_limits"), "rate_limits"))
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
        unlimited = _as_bool(f, spec.get("unlimited"), "unlimited")
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
        for entry in _as_list(f, spec.get("replaces"), "replaces"):
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
        multiplier = 1 if multiplier is None else _as_uint(f, multiplier, "unit_multiplier")
        if multiplier < 1:
            raise self.fail(f"'{path}': unit_multiplier must be at least 1")
        burst = spec.get("burst")
        burst = None if burst is None else _as_uint(f, burst, "burst")
        overdraft = _as_uint(f, spec.get("overdraft"), "overdraft")
        calendar = _as_bool(f, spec.get("calendar"), "calendar")
        timezone = as_str(f, spec.get("timezone"), "timezone") or "UTC"
        if spec.get("timezone") is not None:
            try:
                ZoneInfo(timezone)
            except (ZoneInfoNotFoundError, ValueError):
                raise self.fail(f"'{path}': unknown timezone '{timezone}'") from None
        self._check_extensions(path, algorithm, burst, overdraft, calendar, spec, unit, unlimited)
        rpu = _as_uint(f, spec.get("requests_per_unit"), "requests_per_unit")
        if overdraft > rpu:
            raise self.fail(f"'{path}': overdraft must not exceed requests_per_unit")
        charge = as_str(f, spec.get("charge"), "charge") or "on_allow"
        if charge not in ("on_allow", "always"):
            raise self.fail(f"'{path}': charge must be 'on_allow' or 'always', not '{charge}'")
        if not unlimited and unit not in UNIT_SECONDS:
            raise self.fail(f"invalid rate limit unit '{unit_text}'")
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


def parse_usage_stats(file: str, raw: Any) -> UsageConfig | None:
    """The domain-level `usage_stats` block (see rls.engine.usage)."""
    if raw is None:
        return None

    def fail(message: str) -> ConfigError:
        return ConfigError(file, f"usage_stats: {message}")

    if not isinstance(raw, dict):
        raise fail("must be a map")
    unknown = set(raw) - {"days", "timezone", "calls", "distinct"}
    if unknown:
        raise fail(f"unknown key '{sorted(unknown)[0]}'")
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

    calls = [keys_of(item, "calls entry") for item in _as_list(file, raw.get("calls"), "calls")]
    distinct = []
    for item in _as_list(file, raw.get("distinct"), "distinct"):
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise fail("distinct entries need a key, e.g. {key: user, per: app}")
        per = keys_of(item.get("per"), "distinct per") if item.get("per") is not None else ()
        distinct.append(DistinctStat(item["key"], per))
    if not calls and not distinct:
        raise fail("needs calls or distinct")
    return UsageConfig(days, timezone, calls, distinct)

_WILDCARD_CACHE: dict[str, re.Pattern[str]] = {}


def wildcard_regex(pattern: str) -> re.Pattern[str]:
    """`*` matches zero or more characters, anywhere, any number of times; nothing else is magic."""
    compiled = _WILDCARD_CACHE.get(pattern)
    if compiled is None:
        body = ".*".join(re.escape(part) for part in pattern.split("*"))
        compiled = re.compile(body, re.DOTALL)
        _WILDCARD_CACHE[pattern] = compiled
    return compiled
