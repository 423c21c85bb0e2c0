"""A `*` in a descriptor key: literal in rls, a wildcard in envoyproxy/ratelimit.

The reference joins a request entry into one string, `key_value`, and tries every config node
whose own joined string (`key_value`, or `key` without a value) holds a `*` as a pattern over
it, in config order, once no node matched the entry exactly; each `*` stands for any run of
characters (config_impl.go: `wildcardMatch` over the `*`-split key). So a `*` in a key is a
wildcard there. rls matches the key exactly and its `*` literally (a value must not reach
into the key: docs/migration.md).

The two decide alike for every entry that a node of the level takes exactly, which is every
entry Envoy Gateway's Envoy sends for its route keys `httproute/…/match/0/*` (key and value
both the route's name, each route with a node of its own). They differ for an entry that no
node takes exactly and whose `key_value` the pattern fits: another key (`foo*` fits
`foobar`), or a value the key's `*` reaches into. Which entries come depends on Envoy's
config, which rls does not see: so the matcher says so where it happens (`tell_if_differs`,
once per node per process), and `rls check-config`, offline, notes each such node
(`offline_notes`). A config load does not warn: a control plane's push would repeat it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

from rls.config.errors import ConfigWarning
from rls.config.model import Level, Node, RateLimitConfig
from rls.memo import BoundedCache

log = logging.getLogger("rls.match")

# The nodes already told about (domain, depth, node): each once per process, bounded.
_TOLD = BoundedCache("key_wildcards_told", 1_000, 256 << 10)


def reference_choice(level: Level, key: str, value: str) -> Node | None:
    """The node envoyproxy/ratelimit's wildcard step takes at `level` for an entry no node
    took exactly: the first in config order whose pattern fits, over `key_value` for a node
    with `*` in its key, over the value for a value wildcard of the entry's key."""
    joined = f"{key}_{value}"
    for node in level.reference_wildcards:
        if node.key_pattern is not None:
            if node.key_pattern.fullmatch(joined) is not None:
                return node
        elif node.key == key and node.pattern is not None and node.pattern.fullmatch(value):
            return node
    return None


def tell_if_differs(
    domain: str, entries: Sequence[tuple[str, str]], index: int, level: Level,
    chosen: Node | None,
) -> None:
    """Log (once per node) when envoyproxy/ratelimit would take a node with `*` in its key for
    entry `index`, where rls took `chosen` (a value wildcard, the key's default, or nothing).
    Called only for levels that have such a node, for entries no node took exactly."""
    key, value = entries[index]
    theirs = reference_choice(level, key, value)
    if theirs is None or theirs is chosen or theirs.key_pattern is None:
        return
    told = (domain, index, theirs.stats_part)  # the same node in every later config too
    if told in _TOLD:
        return
    _TOLD.put(told, True, 64 + len(domain) + len(theirs.stats_part))
    here = (f"takes node '{chosen.stats_part}'" if chosen is not None
            else "has no node for it")
    text = ", ".join(f"{k}={v}" for k, v in entries)
    log.warning(
        "descriptor %s [%s]: envoyproxy/ratelimit decides entry %s=%s by node '%s' ('*' in "
        "a key is a wildcard over key_value there); rls matches keys exactly, so here it %s: "
        "to decide alike, give a node the request's key and put the wildcard in its value "
        "(said once per node)", domain, text, key, value, theirs.stats_part, here,
    )


def _star_keys(level: Level | None, path: str) -> Iterator[tuple[str, Node]]:
    if level is None:
        return
    for node in level.ordered:
        where = f"{path}.{node.stats_part}"
        if node.key_pattern is not None:
            yield where, node
        yield from _star_keys(node.children, where)


def offline_notes(file: str, config: RateLimitConfig) -> list[ConfigWarning]:
    """For `rls check-config`: each node of `file`'s config with `*` in its key."""
    return [
        ConfigWarning(
            file,
            f"'*' in key '{node.key}' is literal in rls: envoyproxy/ratelimit also matches "
            f"entries whose key_value fits '{node.stats_part}' as a pattern (request keys "
            f"other than '{node.key}'); rls logs it when a request is decided differently. "
            "To decide alike, put the wildcard in value:",
            node=where,
        )
        for name, domain in config.domains.items()
        for where, node in _star_keys(domain.root, name)
    ]
