"""Immutable, compiled view of the descriptor config.

The loader turns YAML into these objects once per (re)load; the request path only reads them,
so everything the hot path needs (window length, stats key, replaces set) is precomputed here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from rls.core.limits import ALGORITHMS, MAX_WINDOW_SECONDS, UNIT_SECONDS, Limit, Unit

__all__ = [
    "ALGORITHMS",
    "MAX_WINDOW_SECONDS",
    "UNIT_SECONDS",
    "Domain",
    "Level",
    "Limit",
    "Node",
    "RateLimitConfig",
    "Unit",
]


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
    usage: Any = None  # rls.core.usage.UsageConfig when usage_stats is configured
    # `key_hash: md5|xxh3`: counter keys carry a digest of the descriptor (rls.core.keys);
    # "" keeps them readable.
    key_hash: str = ""


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
