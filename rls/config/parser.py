"""Parse and validate one descriptor YAML document, with the reference service's conditions.

Validation mirrors envoyproxy/ratelimit (see reference/ratelimit-compat.md §1.3): a flat key
whitelist checked at any depth (metadata excepted), then typed checks. Messages are the
reference's so that operators grepping for them find the same text. Extensions of DESIGN §5
are validated here too.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rls.config.errors import ConfigError, ConfigWarning
from rls.config.model import MAX_WINDOW_SECONDS, UNIT_SECONDS, Level, Limit, Node, Unit
from rls.config.yaml_source import (
    YamlBool,
    YamlMap,
    as_bool,
    as_list,
    as_str,
    as_uint,
    render,
)
from rls.core.algorithms.registry import ALGORITHM_NAMES as ALGORITHMS
from rls.core.algorithms.registry import BURST_ALGORITHMS
from rls.core.limits import WINDOW_ALIGNED, WINDOW_ROLLING, WINDOWS
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
        "window",
        "timezone",
        "charge",
        "accept_releases",
        "usage_stats",
        "failure_mode",
        "key_hash",
    }
)
VALID_KEYS = REFERENCE_KEYS | EXTENSION_KEYS


def did_you_mean(key: str) -> str | None:
    """A hint for a misspelled config key (`requests_per_unti` -> `requests_per_unit`)."""
    close = difflib.get_close_matches(key, sorted(VALID_KEYS), n=1, cutoff=0.6)
    if not close:
        folded = key.replace("_", "").replace("-", "").lower()
        close = [k for k in sorted(VALID_KEYS) if k.replace("_", "") == folded]
    return f"did you mean '{close[0]}'?" if close else None


def line_of(mapping: Any, key: Any = None) -> int | None:
    """Line of `key` in a mapping read by parse_yaml (or of the mapping itself); None if unknown."""
    if isinstance(mapping, YamlMap):
        return mapping.line_of(key) if key is not None else mapping.line
    return None


def node_part(raw: dict[Any, Any]) -> str:
    """`key_value` (or `key`) of a descriptor node, for node paths in messages."""
    key, value = raw.get("key"), raw.get("value")
    key = render(key) if key is not None else ""
    value = render(value) if value is not None else ""
    key = key or "<no key>"
    return f"{key}_{value}" if value else key


def check_keys(file: str, obj: Any, warnings: list[ConfigWarning] | None = None) -> None:
    """The reference's generic pass: every map key at any depth must be a whitelisted string.

    Errors keep the reference's text and carry the line and node path; a key repeated in one
    mapping (YAML keeps the last one silently) becomes a warning.
    """
    root = ""
    if isinstance(obj, dict) and isinstance(obj.get("domain"), str):
        root = obj["domain"]
    _check_keys(file, obj, warnings, root, line_of(obj), in_descriptors=False)


def _check_keys(
    file: str,
    obj: Any,
    warnings: list[ConfigWarning] | None,
    path: str,
    line: int | None,
    in_descriptors: bool,
) -> None:
    if isinstance(obj, dict):
        if in_descriptors:
            path = f"{path}.{node_part(obj)}" if path else node_part(obj)
        if warnings is not None and isinstance(obj, YamlMap):
            for key, key_line in obj.duplicates:
                warnings.append(
                    ConfigWarning(
                        file,
                        f"key '{render(key)}' appears twice in one mapping; "
                        "only the last one is used",
                        key_line,
                        path,
                    )
                )
        for k, v in obj.items():
            k_line = line_of(obj, k)
            if not isinstance(k, str):
                raise ConfigError(
                    file, f"config error, key is not of type string: {render(k)}",
                    line=k_line, node=path,
                )
            child = f"{path}.{k}" if path else k
            if k not in VALID_KEYS:
                raise ConfigError(
                    file, f"config error, unknown key '{k}'",
                    line=k_line, node=child, hint=did_you_mean(k),
                )
            if k in ("metadata", "usage_stats"):
                # metadata: arbitrary user data, not validated (reference behaviour);
                # usage_stats: validated by parse_usage_stats.
                continue
            if k == "descriptors":
                _check_keys(file, v, warnings, path, k_line, in_descriptors=True)
            else:
                _check_keys(file, v, warnings, child, k_line, in_descriptors=False)
    elif isinstance(obj, list):
        for index, item in enumerate(obj):
            if not isinstance(item, dict):
                raise ConfigError(
                    file,
                    f"config error, yaml file contains list of type other than map: {render(item)}",
                    line=line, node=path,
                )
            item_path = path if in_descriptors else f"{path}[{index}]"
            _check_keys(file, item, warnings, item_path, line_of(item) or line, in_descriptors)
    elif obj is None or isinstance(obj, (str, bool, int, YamlBool)):
        return
    else:
        raise ConfigError(
            file, "error checking config", line=line, node=path,
            hint=f"{render(obj)} is not a string, integer or boolean",
        )


def parse_unit(text: str) -> Unit | None:
    try:
        unit = Unit[text.upper()]
    except KeyError:
        return None
    return None if unit is Unit.UNKNOWN else unit


class DomainParser:
    """Builds the node tree of one file into an existing domain root (merging allowed)."""

    def __init__(
        self, file: str, domain: str, warnings: list[ConfigWarning] | None = None
    ) -> None:
        self.file = file
        self.domain = domain
        # Things that load but are probably mistakes; errors under --strict.
        self.warnings: list[ConfigWarning] = [] if warnings is None else warnings

    def fail(self, message: str, field: str | None = None) -> ConfigError:
        return ConfigError(self.file, message, field=field)

    def add_descriptors(self, nodes: list[Node], items: Any, parent_path: str) -> None:
        """Parse `items` into nodes appended to `nodes` (one level; a merged domain's root
        gathers several files' nodes before it is frozen into a Level)."""
        seen = {(n.key, n.value) for n in nodes}
        for raw in as_list(self.file, items, "descriptors"):
            try:
                # Like the reference, a duplicate is reported before the node's own problems.
                key = as_str(self.file, raw.get("key"), "key")
                if key:
                    self._check_duplicate(
                        seen, key, as_str(self.file, raw.get("value"), "value"), parent_path
                    )
                node = self._node(raw, parent_path)
            except ConfigError as exc:
                field = exc.field if exc.field in raw else None
                raise exc.locate(
                    line_of(raw, field), f"{parent_path}.{node_part(raw)}"
                ) from None
            nodes.append(node)
            seen.add((node.key, node.value))

    def _check_duplicate(
        self, seen: set[tuple[str, str]], key: str, value: str, parent_path: str
    ) -> None:
        """Two nodes with the same key and value at one level (also across merged files).

        Unlike the reference, which compares the joined `key_value` string, the real pair is
        compared: `key: a, value: b_c` and `key: a_b, value: c` are different nodes here (the
        counter keys are injective too), while the reference rejects them as duplicates.
        """
        if (key, value) in seen:
            composite = f"{key}_{value}" if value else key
            raise self.fail(f"duplicate descriptor composite key '{parent_path}.{composite}'")

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
                f"but found key '{composite}'",
                field="share_threshold",
            )
        metadata = raw.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise self.fail("error parsing metadata: metadata must be a map", field="metadata")
        detailed = as_bool(self.file, raw.get("detailed_metric"), "detailed_metric")
        to_metric = as_bool(self.file, raw.get("value_to_metric"), "value_to_metric")
        shadow = as_bool(self.file, raw.get("shadow_mode"), "shadow_mode")
        quota = as_bool(self.file, raw.get("quota_mode"), "quota_mode")
        specs: list[Any] = []
        if raw.get("rate_limit") is not None:
            specs.append(raw["rate_limit"])
        specs.extend(as_list(self.file, raw.get("rate_limits"), "rate_limits"))
        limits = []
        single = raw.get("rate_limit") is not None
        for index, spec in enumerate(specs):
            where = "rate_limit" if single and not index else f"rate_limits[{index - single}]"
            if not isinstance(spec, dict):
                raise self.fail(
                    "error loading config file: yaml: unmarshal errors: rate_limit must be a map",
                    field="rate_limit" if where == "rate_limit" else "rate_limits",
                )
            try:
                limits.append(self._limit(spec, path, shadow, quota, index))
            except ConfigError as exc:
                field = exc.field if exc.field in spec else None
                raise exc.locate(line_of(spec, field), f"{path}.{where}") from None
            if spec.get("requests_per_unit") is None and not limits[-1].unlimited:
                self.warnings.append(
                    ConfigWarning(
                        self.file,
                        "rate_limit without requests_per_unit: the limit is 0, "
                        "every request is over it",
                        line_of(spec),
                        f"{path}.{where}",
                    )
                )
        self._check_limit_set(limits, path)
        if len(limits) > 1:
            distinct_metric_keys(limits, path)
        children = None
        child_items = raw.get("descriptors")
        if child_items:
            kids: list[Node] = []
            self.add_descriptors(kids, child_items, path)
            children = Level.of(kids)
        return Node(
            key=key,
            value=value,
            limits=tuple(limits),
            children=children,
            detailed_metric=detailed,
            value_to_metric=to_metric,
            share_threshold=share,
            metadata=metadata,
            stats_part=composite,
            pattern=wildcard_regex(value) if "*" in value else None,
        )

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
                raise self.fail("should not specify rate limit unit when unlimited", "unit")
            unit = Unit.UNKNOWN
        elif unit is None:
            raise self.fail(f"invalid rate limit unit '{unit_text}'", "unit")
        name = as_str(f, spec.get("name"), "name")
        replaces: set[str] = set()
        for entry in as_list(f, spec.get("replaces"), "replaces"):
            rname = as_str(f, entry.get("name"), "name") if isinstance(entry, dict) else ""
            if not rname:
                raise self.fail("should not have an empty replaces entry", "replaces")
            if rname == name:
                raise self.fail("replaces should not contain name of same descriptor", "replaces")
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
        rolling = self._rolling(spec, path)
        timezone = as_str(f, spec.get("timezone"), "timezone") or "UTC"
        if spec.get("timezone") is not None:
            try:
                ZoneInfo(timezone)
            except (ZoneInfoNotFoundError, ValueError):
                raise self.fail(f"'{path}': unknown timezone '{timezone}'") from None
        self._check_extensions(
            path, algorithm, burst, overdraft, calendar, rolling, spec, unit, unlimited
        )
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
            rolling=rolling,
            timezone=timezone,
            charge_always=charge == "always",
            accept_releases=None if accept is None else as_bool(f, accept, "accept_releases"),
            full_key=path,
            index=index,
        )

    def _rolling(self, spec: dict[str, Any], path: str) -> bool:
        """`window:` — aligned (default) or rolling_from_first_hit."""
        window = as_str(self.file, spec.get("window"), "window") or WINDOW_ALIGNED
        if window not in WINDOWS:
            raise self.fail(
                f"'{path}': unknown window '{window}' (one of {', '.join(WINDOWS)})", "window"
            )
        return window == WINDOW_ROLLING

    def _check_extensions(
        self,
        path: str,
        algorithm: str,
        burst: int | None,
        overdraft: int,
        calendar: bool,
        rolling: bool,
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
        if rolling:
            # A rolling window has its own start per key: no calendar bounds to align to, no
            # next window to owe overdraft debt to, no window for the other algorithms.
            where = "window"
            if algorithm != "fixed_window":
                why = f"applies to fixed_window only, not {algorithm}"
            elif calendar:
                why, where = "cannot be combined with calendar: true", "calendar"
            elif overdraft:
                why, where = "cannot be combined with overdraft", "overdraft"
            else:
                return
            raise self.fail(f"'{path}': window {WINDOW_ROLLING} {why}", where)



def distinct_metric_keys(limits: list[Limit], path: str) -> None:
    """Several limits on one node (`rate_limits:`) must not share one metric series: each gets
    `path.<name>`, or `path.<N><unit>[_<algorithm>]` (`d.user.1second`, `d.user.1day`).
    Limits are frozen: the list's items are replaced."""
    seen: set[str] = set()
    for i, lim in enumerate(limits):
        suffix = lim.name or f"{lim.unit_multiplier}{lim.unit.name.lower()}"
        if not lim.name and lim.algorithm != "fixed_window":
            suffix += f"_{lim.algorithm}"
        if lim.calendar and not lim.name:
            suffix += "_calendar"
        if lim.rolling and not lim.name:
            suffix += "_rolling"
        if suffix in seen:
            suffix += f"_{lim.index}"
        seen.add(suffix)
        limits[i] = dataclasses.replace(lim, full_key=f"{path}.{suffix}")


# Patterns of every config ever loaded pass through here: bounded (rls.memo), LRU.
_WILDCARD_CACHE = BoundedCache("wildcard", 10_000, 8 << 20)


def wildcard_regex(pattern: str) -> re.Pattern[str]:
    """`*` matches zero or more characters, anywhere, any number of times; nothing else is magic."""
    compiled: re.Pattern[str] | None = _WILDCARD_CACHE.get(pattern)
    if compiled is None:
        body = ".*".join(re.escape(part) for part in pattern.split("*"))
        compiled = re.compile(body, re.DOTALL)
        _WILDCARD_CACHE.put(pattern, compiled, 4 * len(pattern) + 600)  # regex object ~ 4x
    return compiled
