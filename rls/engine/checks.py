"""Building checks from descriptors: match results per descriptor, and folding checks that
share a counter. Pure functions over config and engine values."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from rls.config.matcher import match, needs_dynamic_stats, stats_key
from rls.config.model import Domain, Limit
from rls.core.keys import counter_key
from rls.core.model import CANDIDATE, FLAG_BITS, NEGATIVE, TWIN_SHIFT, Check
from rls.engine.decision import OVER_LIMIT, UNLIMITED_REMAINING, DescriptorIn, Status
from rls.memo import STR_OVERHEAD, TUPLE_OVERHEAD, BoundedCache, entries_cost


def match_targets(
    dom: Domain, domain: str, entries: tuple[tuple[str, str], ...], prefix: str
) -> tuple[tuple[Limit, str, str | None, Mapping[str, Any] | None], ...]:
    """(limit, counter key, dynamic stats key, node metadata) for every limit matched."""
    path = match(dom, entries)
    if path is None:
        return ()
    parts = [
        (k, node.value if node.share_threshold else v)
        for node, (k, v) in zip(path, entries, strict=True)
    ]
    dyn = stats_key(domain, path, entries) if needs_dynamic_stats(path) else None
    meta = path[-1].metadata
    return tuple(
        (limit, counter_key(prefix, domain, parts, limit.ident, dom.key_hash), dyn, meta)
        for limit in path[-1].limits
    )


def match_cost(
    entries: tuple[tuple[str, str], ...],
    targets: tuple[tuple[Limit, str, str | None, Mapping[str, Any] | None], ...],
) -> int:
    """Estimated bytes of one match-memo entry (its key and value), for BoundedCache."""
    cost = entries_cost(entries) + TUPLE_OVERHEAD
    for _, key, dyn, _ in targets:
        cost += len(key) + STR_OVERHEAD + TUPLE_OVERHEAD + 48
        if dyn is not None:
            cost += len(dyn) + STR_OVERHEAD
    return cost


def passed_metadata(
    memo: BoundedCache, descriptors: Sequence[DescriptorIn], statuses: list[Status]
) -> list[dict[str, Any]]:
    """Config metadata of descriptors that passed and are limited (not unlimited), in order
    (from the match memo the decision just filled)."""
    out = []
    for desc, status in zip(descriptors, statuses, strict=True):
        if status.code == OVER_LIMIT or status.remaining == UNLIMITED_REMAINING:
            continue
        targets = memo.get(desc.entries)
        if targets and targets[0][3]:
            out.append(targets[0][3])
    return out


def merge_same_counter(checks: list[Check]) -> tuple[list[Check], list[int] | None]:
    """Fold checks on the same counter (two descriptors of one request mapping to one key)
    into one check, so the counter is charged for both, as with the reference's two INCRBYs.

    Hits are netted: charges add, releases (is_negative_hits) subtract; a negative net is a
    release of that size. Returns (checks, None) when there is nothing to fold.
    """
    index: dict[str, int] = {}
    net: list[int] = []
    merged: list[Check] = []
    slots: list[int] = []
    for check in checks:
        signed = -check.hits if check.flags & NEGATIVE else check.hits
        j = index.get(check.key)
        if j is None:
            index[check.key] = len(merged)
            slots.append(len(merged))
            merged.append(check)
            net.append(signed)
        else:
            net[j] += signed
            slots.append(j)
    if len(merged) == len(checks):
        return checks, None
    for j, check in enumerate(merged):
        total = net[j]
        flags = check.flags | NEGATIVE if total < 0 else check.flags & ~NEGATIVE
        if flags & CANDIDATE:  # its twin's index in the merged list
            flags = (flags & FLAG_BITS) | (slots[flags >> TWIN_SHIFT] << TWIN_SHIFT)
        if flags != check.flags or total != (-check.hits if check.flags & NEGATIVE else check.hits):
            merged[j] = replace(check, hits=abs(total), flags=flags)
    return merged, slots
