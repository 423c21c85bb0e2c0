"""Local fallback limiter: while the backend is away, grant a share of each limit in-process.

Bound: with N processes each granting share s, at most N * s * limit per window pass during an
outage (s = 1/N keeps the total near the limit); local counts start from zero.
"""

from __future__ import annotations

import math
from dataclasses import replace

from rls.config.model import Limit
from rls.core.model import Check, Outcome
from rls.engine.checks import merge_same_counter
from rls.observability.metrics import Metrics
from rls.stores.memory import MemoryBackend


class FallbackLimiter:
    def __init__(self, share: float, metrics: Metrics) -> None:
        self.share = share
        self.metrics = metrics
        self._store = MemoryBackend()
        self._calls = 0
        self._scaled: dict[int, tuple[Limit, Limit]] = {}

    def decide(self, checks: list[Check], now_ms: int | None) -> list[Outcome]:
        self.metrics.fallback.inc()
        self._calls += 1
        if self._calls % 10_000 == 0:
            self._store.sweep()
        local = [replace(c, limit=self._scaled_limit(c.limit)) for c in checks]
        if len(local) > 1:
            merged, slots = merge_same_counter(local)
            if slots is not None:
                outcomes = self._store.decide_now(merged, now_ms).outcomes
                return [outcomes[j] for j in slots]
        return self._store.decide_now(local, now_ms).outcomes

    def _scaled_limit(self, limit: Limit) -> Limit:
        cached = self._scaled.get(id(limit))
        if cached is None or cached[0] is not limit:
            share = self.share
            copy = replace(
                limit,
                requests_per_unit=math.ceil(limit.requests_per_unit * share),
                burst=None if limit.burst is None else math.ceil(limit.burst * share),
                overdraft=math.ceil(limit.overdraft * share),
            )
            if len(self._scaled) > 4096:
                self._scaled.clear()
            cached = self._scaled[id(limit)] = (limit, copy)
        return cached[1]
