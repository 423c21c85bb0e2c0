"""One bounded cache type for every memo on the request path: memory bounded in bytes, with a
metric for its size (docs/reliability.md, "Memory").

A memo keyed by request data grows with what clients send: counted in entries only, 4,096
remembered 64 KB requests held the process at 865 MB. BoundedCache bounds both the entry count
and an estimate of the bytes held (keys and values as the caller sizes them), evicting the
least recently used entries first. Its size is published as `rls_memo_bytes{memo}` and
`rls_memo_entries{memo}` (summed over the caches of one name, e.g. every domain's match memo);
the gauges move only when an entry is added or dropped, never on a hit.

Defaults (docs/reliability.md, "Memory"):
- `request_parse`: decoded requests by their wire bytes, 4,096 entries / 16 MiB per process;
- `match`: match results by descriptor entries, 10,000 entries / 16 MiB per domain;
- `plan`: request shapes' checks, 4,096 entries / 8 MiB per process;
- `response_shape`: answers' protobuf messages by shape, 1,024 entries / 4 MiB per process.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import Any

MATCH_MEMO_ENTRIES = 10_000
MATCH_MEMO_BYTES = 16 << 20
PARSE_MEMO_ENTRIES = 4096
PARSE_MEMO_BYTES = 16 << 20
# Request shapes' checks (rls.engine.limiter): one plan per memoised request, so as many.
PLAN_ENTRIES = PARSE_MEMO_ENTRIES
PLAN_BYTES = 8 << 20
PLAN_CHECK_BYTES = 160  # a planned Check (its limit and key are the match memo's)
# Answers' messages by shape (rls.services.convert.ResponseShapes): a config has few shapes.
RESPONSE_SHAPE_ENTRIES = 1024
RESPONSE_SHAPE_BYTES = 4 << 20

# Gauge children by memo name, set by rls.observability.metrics.Metrics (the most recent one wins).
_GAUGES: dict[str, tuple[Any, Any]] = {}

STR_OVERHEAD = sys.getsizeof("")  # CPython str header (ASCII)
TUPLE_OVERHEAD = sys.getsizeof(())
ENTRY_OVERHEAD = 200  # the cache's own bookkeeping per entry (ordered-dict node, tuple)


def publish_to(name: str, bytes_gauge: Any, entries_gauge: Any) -> None:
    """Report the sizes of every BoundedCache called `name` in these gauge children."""
    _GAUGES[name] = (bytes_gauge, entries_gauge)


def entries_cost(entries: Iterable[tuple[str, str]]) -> int:
    """Estimated bytes of a descriptor's ((key, value), …) tuple."""
    total = TUPLE_OVERHEAD
    for key, value in entries:
        total += len(key) + len(value) + 2 * STR_OVERHEAD + TUPLE_OVERHEAD + 16
    return total


class BoundedCache:
    """LRU map bounded by `max_entries` and by `max_bytes` (sum of the costs given to put)."""

    __slots__ = ("_data", "max_bytes", "max_entries", "name", "nbytes")

    def __init__(self, name: str, max_entries: int, max_bytes: int) -> None:
        self.name = name
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._data: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()

    def get(self, key: Hashable, default: Any = None) -> Any:
        found = self._data.get(key)
        if found is None:
            return default
        self._data.move_to_end(key)
        return found[0]

    def put(self, key: Hashable, value: Any, cost: int) -> None:
        """Remember `value` (costing about `cost` bytes with its key); an entry larger than
        the whole budget is not kept."""
        cost += ENTRY_OVERHEAD
        data = self._data
        old = data.pop(key, None)
        freed, dropped = (old[1], 1) if old is not None else (0, 0)
        self.nbytes -= freed
        if cost > self.max_bytes:
            self._account(-freed, -dropped)
            return
        while data and (len(data) >= self.max_entries or self.nbytes + cost > self.max_bytes):
            _, (_, evicted) = data.popitem(last=False)
            self.nbytes -= evicted
            freed += evicted
            dropped += 1
        data[key] = (value, cost)
        self.nbytes += cost
        self._account(cost - freed, 1 - dropped)

    def clear(self) -> None:
        self._account(-self.nbytes, -len(self._data))
        self._data.clear()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    def __del__(self) -> None:  # a reload drops whole Domains and their memos
        if self._data:
            self._account(-self.nbytes, -len(self._data))

    def _account(self, nbytes: int, entries: int) -> None:
        gauges = _GAUGES.get(self.name)
        if gauges is not None and (nbytes or entries):
            gauges[0].inc(nbytes)
            gauges[1].inc(entries)
