"""Descriptor matching, exactly in the reference order.

Per request entry: exact `key=value` node, then the level's wildcard nodes for that key in
config order (first match wins), then the key-only default node. No backtracking, and the
request must end on a node that carries a limit.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rls.config.key_wildcards import tell_if_differs
from rls.config.model import Domain, Node

log = logging.getLogger("rls.match")


def match(domain: Domain, entries: Sequence[tuple[str, str]]) -> list[Node] | None:
    """The nodes matched level by level, or None when the descriptor has no limit.

    At debug level, logs which limit the descriptor matched and why. The limiter memoizes
    match results per config, so this runs once per distinct descriptor, never per request.
    """
    path = _match(domain, entries)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s", explain(domain, entries, path))
    return path


def _how(node: Node) -> str:
    if not node.value:
        return f"{node.key} (any value)"
    if "*" in node.value:
        return f"{node.key}={node.value} (wildcard)"
    return f"{node.key}={node.value} (exact)"


def explain(
    domain: Domain, entries: Sequence[tuple[str, str]], path: list[Node] | None
) -> str:
    """One line: the descriptor, what it matched level by level, and the limit (or why none)."""
    text = ", ".join(f"{k}={v}" for k, v in entries)
    head = f"descriptor {domain.name} [{text}]"
    if not entries:
        return f"{head}: no entries, no limit"
    if path is not None:
        limits = "; ".join(
            "unlimited" if lim.unlimited
            else f"{lim.full_key}: {lim.requests_per_unit}/"
            f"{lim.unit_multiplier if lim.unit_multiplier > 1 else ''}{lim.unit.name.lower()}"
            f"{' ' + lim.algorithm if lim.algorithm != 'fixed_window' else ''}"
            f"{' shadow' if lim.shadow_mode else ''}"
            for lim in path[-1].limits
        )
        return f"{head}: matched {' > '.join(_how(n) for n in path)} -> {limits}"
    # Why not: walk again, the same way, stopping where it fails.
    level = domain.root
    walked: list[str] = []
    for i, (key, value) in enumerate(entries):
        node = (level.by_key.get(key) or {}).get(value) if value else None
        if node is None:
            node = next((c for rx, c in level.wildcards.get(key, ()) if rx.fullmatch(value)),
                        None) or level.defaults.get(key)
        if node is None:
            where = " > ".join(walked) or "the domain root"
            return f"{head}: no limit: nothing for {key}={value} under {where}"
        walked.append(_how(node))
        if i == len(entries) - 1:
            return f"{head}: no limit: {' > '.join(walked)} has no rate_limit (container)"
        if node.children is None:
            return (f"{head}: no limit: {' > '.join(walked)} has no children for the "
                    f"{len(entries) - i - 1} remaining entr(y/ies)")
        level = node.children
    return f"{head}: no limit"


def _match(domain: Domain, entries: Sequence[tuple[str, str]]) -> list[Node] | None:
    if not entries:
        return None
    level = domain.root
    path: list[Node] = []
    last = len(entries) - 1
    for i, (key, value) in enumerate(entries):
        node = None
        values = level.by_key.get(key)
        if values is not None and value:
            node = values.get(value)
        if node is None:
            patterns = level.wildcards.get(key)
            if patterns is not None:
                for regex, candidate in patterns:
                    if regex.fullmatch(value) is not None:
                        node = candidate
                        break
            if node is None:
                node = level.defaults.get(key)
            if level.reference_wildcards:  # a `*` in a key here: the reference may differ
                tell_if_differs(domain.name, entries, i, level, node)
            if node is None:
                return None
        path.append(node)
        if i == last:
            return path if node.limits else None
        if node.children is None:
            return None
        level = node.children
    return None


def _entry_part(key: str, value: str) -> str:
    """`key_value`, or `key` alone for an empty value (the reference's rule)."""
    return f"{key}_{value}" if value else key


def stats_key(domain: str, path: Sequence[Node], entries: Sequence[tuple[str, str]]) -> str:
    """Reference stats key for a match whose path uses detailed_metric or value_to_metric.

    - `detailed_metric`: every entry as `key_value` (the reference writes `key_` for an empty
      value here), except entries matched by a `share_threshold` wildcard, which keep the
      pattern (`key_files/*`) — then empty values give `key` alone.
    - otherwise, per level: a `share_threshold` wildcard keeps its pattern, a `value_to_metric`
      node matched by wildcard or default shows the request value (`key` alone when empty),
      every other node its config part.
    """
    shared = any(node.share_threshold for node in path)
    if path[-1].detailed_metric:
        if not shared:
            return ".".join([domain] + [f"{k}_{v}" for k, v in entries])
        return ".".join(
            [domain]
            + [
                f"{k}_{node.value}" if node.share_threshold else _entry_part(k, v)
                for node, (k, v) in zip(path, entries, strict=True)
            ]
        )
    parts = [domain]
    for node, (key, value) in zip(path, entries, strict=True):
        if node.share_threshold:
            parts.append(f"{key}_{node.value}")
        elif node.value_to_metric and (not node.value or "*" in node.value):
            parts.append(_entry_part(key, value))
        else:
            parts.append(node.stats_part)
    return ".".join(parts)


def needs_dynamic_stats(path: Sequence[Node]) -> bool:
    return path[-1].detailed_metric or any(
        n.value_to_metric and (not n.value or "*" in n.value) for n in path
    )
