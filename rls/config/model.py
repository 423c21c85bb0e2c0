"""Immutable, compiled view of the descriptor config.

The loader turns YAML into these objects once per (re)load; the request path only reads them,
so everything the hot path needs (window length, stats key, replaces set) is precomputed here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
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


@dataclass(slots=True, eq=False, frozen=True)
class Node:
    """A descriptor node: one level of the tree, matched against one request entry."""

    key: str
    value: str  # "" for the key-only default node
    limits: tuple[Limit, ...] = ()
    children: Level | None = None
    detailed_metric: bool = False
    value_to_metric: bool = False
    share_threshold: bool = False
    metadata: Mapping[str, Any] | None = None
    # Reference stats-key fragment of this level when matched the ordinary way.
    stats_part: str = ""
    pattern: re.Pattern[str] | None = None  # compiled `value` when it holds a `*` wildcard
    # With a `*` in `key` (literal here): envoyproxy/ratelimit's pattern over `key_value`,
    # kept to tell when the two decide differently (rls.config.key_wildcards).
    key_pattern: re.Pattern[str] | None = None


@dataclass(slots=True, eq=False, frozen=True)
class Level:
    """Children of one node (or the domain root), indexed for the reference matching order.

    Built once from its nodes (`Level.of`) and never changed: a reload builds a new tree.
    """

    by_key: Mapping[str, Mapping[str, Node]]
    wildcards: Mapping[str, tuple[tuple[re.Pattern[str], Node], ...]]
    defaults: Mapping[str, Node]
    ordered: tuple[Node, ...]
    # Only when a node here has `*` in its key: every node envoyproxy/ratelimit tries as a
    # wildcard, in config order (rls.config.key_wildcards); else empty.
    reference_wildcards: tuple[Node, ...] = ()

    @classmethod
    def of(cls, nodes: Iterable[Node]) -> Level:
        ordered = tuple(nodes)
        by_key: dict[str, dict[str, Node]] = {}
        wildcards: dict[str, list[tuple[re.Pattern[str], Node]]] = {}
        defaults: dict[str, Node] = {}
        for node in ordered:
            by_key.setdefault(node.key, {})[node.value] = node
            if not node.value:
                defaults[node.key] = node
            elif node.pattern is not None:
                wildcards.setdefault(node.key, []).append((node.pattern, node))
        frozen_wildcards = {key: tuple(pairs) for key, pairs in wildcards.items()}
        reference: tuple[Node, ...] = ()
        if any(node.key_pattern is not None for node in ordered):
            reference = tuple(n for n in ordered
                              if n.key_pattern is not None or n.pattern is not None)
        return cls(by_key, frozen_wildcards, defaults, ordered, reference)


@dataclass(slots=True, eq=False, frozen=True)
class Domain:
    name: str
    root: Level
    files: tuple[str, ...] = ()
    failure_mode: str | None = None  # allow | deny | error when the store fails; None = global
    usage: Any = None  # rls.core.usage.UsageConfig when usage_stats is configured
    # `key_hash: md5|xxh3`: counter keys carry a digest of the descriptor (rls.core.keys);
    # "" keeps them readable.
    key_hash: str = ""
    # Whether any limit of the domain has candidates (derived): the limiter looks for them
    # only then, so a domain without any pays nothing.
    has_candidates: bool = field(init=False, default=False)
    # The `reserve:` entry keys of the domain's limits (derived): entries with these keys are
    # taken out of every descriptor before matching (rls.engine.reservations). Empty: none.
    reserve_ids: frozenset[str] = field(init=False, default=frozenset())
    reserve_settles: frozenset[str] = field(init=False, default=frozenset())

    def __post_init__(self) -> None:
        limits = limits_of(self)
        derived = object.__setattr__
        derived(self, "has_candidates", any(lim.candidates for lim in limits))
        reserves = [lim.reserve for lim in limits if lim.reserve is not None]
        derived(self, "reserve_ids", frozenset(r.id_key for r in reserves))
        derived(self, "reserve_settles", frozenset(r.settle_key for r in reserves))


def limits_of(domain: Domain) -> list[Limit]:
    """Every limit of a domain's tree, depth first in config order.

    Iterative, not a recursive closure: a closure that calls itself is a reference cycle, and
    one per domain left cyclic garbage behind every build (10,000 domains: 70,000 objects for
    the collector, rls.config.xds.client)."""
    out: list[Limit] = []
    stack = [iter(domain.root.ordered)]
    while stack:
        node = next(stack[-1], None)
        if node is None:
            stack.pop()
            continue
        out.extend(node.limits)
        if node.children is not None:
            stack.append(iter(node.children.ordered))
    return out


@dataclass(slots=True, eq=False, frozen=True)
class RateLimitConfig:
    """The whole loaded config: domains by name, plus where each came from. Immutable: the
    request path reads it without locks, a reload swaps in a new one."""

    domains: Mapping[str, Domain] = field(default_factory=dict)
    files: tuple[str, ...] = ()
    # rls.config.errors.ConfigWarning: loads, but probably a mistake (an error with --strict)
    warnings: tuple[Any, ...] = ()
    # response-cache rules files found in a --config directory: left to --cache-config
    cache_files: tuple[str, ...] = ()

    def all_limits(self) -> list[Limit]:
        return [lim for domain in self.domains.values() for lim in limits_of(domain)]
