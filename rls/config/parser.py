"""Parse and validate one descriptor YAML document, with the reference service's conditions.

Validation mirrors envoyproxy/ratelimit's loader, condition by condition: a flat key
whitelist checked at any depth (metadata excepted), then typed checks. Messages are the
reference's so that operators grepping for them find the same text. Each node's rate limit
specs (with rls's extensions: algorithms, multipliers, burst…) are parsed by
rls/config/limit_parser.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rls.config.errors import ConfigError, ConfigWarning, Problems
from rls.config.errors import did_you_mean as hint_for
from rls.config.limit_parser import LimitParser
from rls.config.model import Level, Limit, Node
from rls.config.yaml_source import (
    YamlBool,
    YamlMap,
    as_bool,
    as_list,
    as_str,
    line_of,
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
        "window",
        "timezone",
        "charge",
        "accept_releases",
        "usage_stats",
        "failure_mode",
        "key_hash",
        "candidates",
        "reserve",
    }
)
VALID_KEYS = REFERENCE_KEYS | EXTENSION_KEYS


def did_you_mean(key: str) -> str | None:
    """A hint for a misspelled config key (`requests_per_unti` -> `requests_per_unit`)."""
    return hint_for(key, VALID_KEYS)


def node_part(raw: dict[Any, Any]) -> str:
    """`key_value` (or `key`) of a descriptor node, for node paths in messages."""
    key, value = raw.get("key"), raw.get("value")
    key = render(key) if key is not None else ""
    value = render(value) if value is not None else ""
    key = key or "<no key>"
    return f"{key}_{value}" if value else key


def check_keys(
    file: str,
    obj: Any,
    warnings: list[ConfigWarning] | None = None,
    problems: Problems | None = None,
) -> None:
    """The reference's generic pass: every map key at any depth must be a whitelisted string.

    Errors keep the reference's text and carry the line and node path; a key repeated in one
    mapping (YAML keeps the last one silently) becomes a warning. With `problems`, every bad
    key is kept there (the walk goes on past it, skipping what is under it); without, the
    first one is raised.
    """
    root = ""
    if isinstance(obj, dict) and isinstance(obj.get("domain"), str):
        root = obj["domain"]
    report = problems.add if problems is not None else _raise
    _KeyWalk(file, warnings, report).keys(obj, root, line_of(obj), False)
    second = getattr(obj, "next_document_line", None)
    if warnings is not None and second is not None:
        warnings.append(ConfigWarning(
            file, "a second YAML document (after ---) is ignored: only the first is read, as "
            "by envoyproxy/ratelimit; give each domain a file of its own", second,
        ))


def _raise(error: ConfigError) -> None:
    raise error


@dataclass(frozen=True, slots=True)
class _KeyWalk:
    """Checks every key of one file's document: `report` takes each problem (or raises it),
    duplicate keys become `warnings` when they are collected."""

    file: str
    warnings: list[ConfigWarning] | None
    report: Callable[[ConfigError], None]

    def keys(self, obj: Any, path: str, line: int | None, in_descriptors: bool) -> None:
        file, report = self.file, self.report
        if isinstance(obj, dict):
            if in_descriptors:
                path = f"{path}.{node_part(obj)}" if path else node_part(obj)
            self._duplicates(obj, path)
            for k, v in obj.items():
                k_line = line_of(obj, k)
                if not isinstance(k, str):
                    report(ConfigError(
                        file, f"config error, key is not of type string: {render(k)}",
                        line=k_line, node=path,
                    ))
                    continue
                child = f"{path}.{k}" if path else k
                if k not in VALID_KEYS:
                    report(ConfigError(
                        file, f"config error, unknown key '{k}'",
                        line=k_line, node=child, hint=did_you_mean(k),
                    ))
                    continue
                if k in ("metadata", "usage_stats", "reserve"):
                    # metadata: arbitrary user data, not validated (reference behaviour);
                    # usage_stats: validated by parse_usage_stats; reserve: by parse_reserve.
                    continue
                if k == "descriptors":
                    self.keys(v, path, k_line, True)
                else:
                    self.keys(v, child, k_line, False)
        elif isinstance(obj, list):
            self.items(obj, path, line, in_descriptors)
        elif obj is None or isinstance(obj, (str, bool, int, YamlBool)):
            return
        else:
            report(ConfigError(
                file, "error checking config", line=line, node=path,
                hint=f"{render(obj)} is not a string, integer or boolean",
            ))

    def _duplicates(self, obj: dict[Any, Any], path: str) -> None:
        if self.warnings is not None and isinstance(obj, YamlMap):
            for key, key_line in obj.duplicates:
                self.warnings.append(
                    ConfigWarning(
                        self.file,
                        f"key '{render(key)}' appears twice in one mapping; "
                        "only the last one is used",
                        key_line,
                        path,
                    )
                )

    def items(self, items: list[Any], path: str, line: int | None, in_descriptors: bool) -> None:
        """A list's items must be maps (the reference's rule), each checked like any map."""
        for index, item in enumerate(items):
            if not isinstance(item, dict):
                self.report(ConfigError(
                    self.file,
                    "config error, yaml file contains list of type other than map: "
                    f"{render(item)}",
                    line=line, node=path,
                ))
                continue
            item_path = path if in_descriptors else f"{path}[{index}]"
            self.keys(item, item_path, line_of(item) or line, in_descriptors)


class DomainParser:
    """Builds the node tree of one file into an existing domain root (merging allowed).

    A node's problems go to `problems` and the next node is parsed: every independent problem
    of a file is reported in one load. What depends on a bad value (a node's limits on its
    unit, say) is not checked further."""

    def __init__(
        self,
        file: str,
        domain: str,
        warnings: list[ConfigWarning] | None = None,
        problems: Problems | None = None,
    ) -> None:
        self.file = file
        self.domain = domain
        # Things that load but are probably mistakes; errors under --strict.
        self.warnings: list[ConfigWarning] = [] if warnings is None else warnings
        self.problems = Problems() if problems is None else problems
        self.limits = LimitParser(file, self.warnings)

    def fail(self, message: str, field: str | None = None) -> ConfigError:
        return ConfigError(self.file, message, field=field)

    def add_descriptors(self, nodes: list[Node], items: Any, parent_path: str) -> None:
        """Parse `items` into nodes appended to `nodes` (one level; a merged domain's root
        gathers several files' nodes before it is frozen into a Level). A bad node is kept
        out, its problems in `self.problems`."""
        seen = {(n.key, n.value) for n in nodes}
        for raw in as_list(self.file, items, "descriptors"):
            if not isinstance(raw, dict):
                continue  # check_keys reported it (a list item that is not a map)
            try:
                # Like the reference, a duplicate is reported before the node's own problems.
                key = as_str(self.file, raw.get("key"), "key")
                if key:
                    self._check_duplicate(
                        seen, key, as_str(self.file, raw.get("value"), "value"), parent_path
                    )
                node = self._node(raw, parent_path)
            except ConfigError as exc:
                self.problems.add(exc.locate_in(raw, f"{parent_path}.{node_part(raw)}"))
                continue
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
        """One node; its own problems are raised together, after its children were parsed
        (their problems are independent of the node's: they go to `self.problems`)."""
        key = as_str(self.file, raw.get("key"), "key")
        if not key:
            raise self.fail("descriptor has empty key")
        value = as_str(self.file, raw.get("value"), "value")
        composite = f"{key}_{value}" if value else key
        path = f"{parent_path}.{composite}"
        found = Problems()
        share = found.check(False, self._share_threshold, raw, value, composite)
        metadata = raw.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            found.add(self.fail("error parsing metadata: metadata must be a map", "metadata"))
        flags = {
            name: found.check(False, as_bool, self.file, raw.get(name), name)
            for name in ("detailed_metric", "value_to_metric", "shadow_mode", "quota_mode")
        }
        limits: list[Limit] = found.check(
            [], self.limits.node_limits, raw, path, flags["shadow_mode"], flags["quota_mode"]
        )
        children = found.check(None, self._children, raw, path)
        found.raise_if_any()
        return Node(
            key=key,
            value=value,
            limits=tuple(limits),
            children=children,
            detailed_metric=flags["detailed_metric"],
            value_to_metric=flags["value_to_metric"],
            share_threshold=share,
            metadata=metadata,
            stats_part=composite,
            pattern=wildcard_regex(value) if "*" in value else None,
            key_pattern=wildcard_regex(composite) if "*" in key else None,
        )

    def _share_threshold(self, raw: dict[str, Any], value: str, composite: str) -> bool:
        """`share_threshold:` — one counter for every value a wildcard matches."""
        share = as_bool(self.file, raw.get("share_threshold"), "share_threshold")
        if share and "*" not in value:
            raise self.fail(
                "share_threshold can only be used with wildcard values (containing '*'), "
                f"but found key '{composite}'",
                field="share_threshold",
            )
        return share

    def _children(self, raw: dict[str, Any], path: str) -> Level | None:
        """The node's own `descriptors:`, one level down (None when it has none)."""
        child_items = raw.get("descriptors")
        if not child_items:
            return None
        kids: list[Node] = []
        self.add_descriptors(kids, child_items, path)
        return Level.of(kids)


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
