"""Bucket ids (maps of strings) matched against a domain's descriptor tree.

A bucket id has no order, a descriptor does. The rule: walk the tree from the top; at each
level, try the bucket's entries whose key the level names, in the level's config order, and
pick the node with the usual ShouldRateLimit rules (exact value, then wildcards in config
order, then the key-only default). Among all paths that end on a node carrying limits, the
longest wins (ties: config order). Entries the path does not use are ignored, so a bucket id
may carry labels such as Envoy's customary static `name` entry.

Examples, for `- key: x-client-id` (limit) with nested `- key: path, value: /slow` (limit):
`{x-client-id: alice}` → `[(x-client-id, alice)]`;
`{name: per-client, x-client-id: alice}` → same path, `name` ignored;
`{x-client-id: alice, path: /slow}` → `[(x-client-id, alice), (path, /slow)]` (deeper wins);
`{name: per-client}` → unmatched.

The ordered entries then go through rls.engine.checks.match_targets, so a bucket and a
ShouldRateLimit descriptor with the same entries share one counter.
"""

from __future__ import annotations

from rls.config.model import Domain, Level, Node

Entries = tuple[tuple[str, str], ...]
MAX_BUCKET_ENTRIES = 16  # bucket ids are small maps; bigger ones are not matched at all


def _node(level: Level, key: str, value: str) -> Node | None:
    """The node an entry selects at one level (same order as rls.config.matcher.match)."""
    values = level.by_key.get(key)
    if values is not None and value:
        node = values.get(value)
        if node is not None:
            return node
    for regex, candidate in level.wildcards.get(key, ()):
        if regex.fullmatch(value) is not None:
            return candidate
    return level.defaults.get(key)


def _keys_in_order(level: Level) -> list[str]:
    seen: dict[str, None] = {}
    for node in level.ordered:
        seen.setdefault(node.key, None)
    return list(seen)


def order_bucket(dom: Domain, bucket: dict[str, str]) -> Entries | None:
    """The bucket's entries in descriptor order along the longest matching path, or None."""
    if not bucket or len(bucket) > MAX_BUCKET_ENTRIES:
        return None
    best: list[tuple[str, str]] | None = None

    def walk(level: Level, used: list[tuple[str, str]]) -> None:
        nonlocal best
        taken = {k for k, _ in used}
        for key in _keys_in_order(level):
            if key in taken or key not in bucket:
                continue
            value = bucket[key]
            node = _node(level, key, value)
            if node is None:
                continue
            path = [*used, (key, value)]
            if node.limits and (best is None or len(path) > len(best)):
                best = path
            if node.children is not None:
                walk(node.children, path)

    walk(dom.root, [])
    return None if best is None else tuple(best)
