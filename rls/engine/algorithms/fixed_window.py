"""Fixed window counter, epoch-aligned like envoyproxy/ratelimit.

State is (window index, count). The window travels in the value rather than in the key, so a
key is stable (declared up front, Cluster-safe) and a stale value from an earlier window reads
as zero even if the store's expiry and the decision clock disagree. Expiry is garbage
collection only: the end of the window plus a grace second.
"""

from __future__ import annotations

from rls.config.model import Limit

State = tuple[int, int] | None
GRACE_MS = 1000


class FixedWindow:
    def evaluate(
        self, state: State, now_ms: int, limit: Limit, hits: int
    ) -> tuple[bool, int, int, int, int]:
        window = limit.window_ms
        count = state[1] if state is not None and state[0] == now_ms // window else 0
        cap = limit.requests_per_unit
        ok = count < cap if hits == 0 else count + hits <= cap
        return ok, max(0, cap - count - hits), max(0, cap - count), window - now_ms % window, count

    def _store(self, count: int, now_ms: int, window: int) -> tuple[State, int]:
        return (now_ms // window, count), now_ms + window - now_ms % window + GRACE_MS

    def charge(self, state: State, now_ms: int, limit: Limit, hits: int) -> tuple[State, int]:
        used = self.evaluate(state, now_ms, limit, 0)[4]
        return self._store(used + hits, now_ms, limit.window_ms)

    def release(self, state: State, now_ms: int, limit: Limit, hits: int) -> tuple[State, int]:
        used = self.evaluate(state, now_ms, limit, 0)[4]
        return self._store(max(0, used - hits), now_ms, limit.window_ms)
