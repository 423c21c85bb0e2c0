"""Local answers for Get: the last known value (store down) and hot keys (store busy).

StaleCache — every answer the store gave (Add or Get) is remembered per counter, bounded in
entries and bytes (least recently updated dropped first). When the store fails, Get answers
from it, marked stale. Consistency: the value this replica last saw, of any age; when the
window it belonged to has ended (by this host's clock), the answer is 0 with the time left
unknown (ttl 0).

HotKeys — Get calls are counted per counter each second; the top N above a threshold are
"hot", and their answers are served from memory for at most `ttl_ms` (≤ 1 s). An Add through
this replica updates the entry at once; every Add publishes on the counter's own pub/sub
channel (`<channel><counter>`), and each replica subscribes to the channels of its hot counters
only, so a message is sent and parsed only where someone caches that counter (a channel nobody
listens to costs Redis a hash lookup, and rls nothing). With invalidation on, a counter's answer
is cached only once its channel is subscribed. Consistency: a hot Get may miss Adds made
elsewhere for the pub/sub delivery time, and for at most `ttl_ms` if a message is lost (e.g.
the subscription was reconnecting).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from rls.frequency.model import Result

log = logging.getLogger("rls.counters")

_ENTRY_OVERHEAD = 120  # bytes per entry besides its key (tuple, ints, dict slot)


class StaleCache:
    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self._data: OrderedDict[str, tuple[int, int]] = OrderedDict()  # key -> (freq, end_ms)

    def __len__(self) -> int:
        return len(self._data)

    def remember(self, ident: str, result: Result, now_ms: int) -> None:
        if self.max_entries <= 0:
            return
        size = len(ident) + _ENTRY_OVERHEAD
        end = now_ms + result.ttl_ms if result.ttl_ms > 0 else 0
        if ident in self._data:
            self._data.move_to_end(ident)
        else:
            self.bytes += size
        self._data[ident] = (result.freq, end)
        while self._data and (len(self._data) > self.max_entries or self.bytes > self.max_bytes):
            old, _ = self._data.popitem(last=False)
            self.bytes -= len(old) + _ENTRY_OVERHEAD

    def answer(self, ident: str, now_ms: int) -> Result | None:
        found = self._data.get(ident)
        if found is None:
            return None
        freq, end = found
        if end and end <= now_ms:  # that window is over; the current one is unknown
            return Result(freq=0, ttl_ms=0, stale=True)
        return Result(freq=freq, ttl_ms=end - now_ms if end else 0, stale=True)


class HotKeys:
    """Which counters are hot this second, and their cached answers."""

    def __init__(
        self,
        top_n: int,
        threshold: float,
        ttl_ms: int,
        clock: Callable[[], float] = time.monotonic,
        max_tracked: int = 100_000,
    ) -> None:
        self.top_n = top_n
        self.threshold = threshold
        self.ttl_s = ttl_ms / 1000
        self._clock = clock
        self.max_tracked = max_tracked
        self._counts: dict[str, int] = {}
        self._second = int(clock())
        self.hot: frozenset[str] = frozenset()
        # Counters whose invalidations reach us (subscribed channels); None: no other replica
        # can change them (memory store), every hot counter may be cached.
        self.watched: frozenset[str] | None = None
        self._answers: dict[str, tuple[float, int, float]] = {}  # key -> (at, freq, ttl end)

    @property
    def enabled(self) -> bool:
        return self.top_n > 0 and self.ttl_s > 0

    def _roll(self, now: float) -> None:
        second = int(now)
        if second == self._second:
            return
        elapsed = max(1, second - self._second)
        rates = ((n / elapsed, key) for key, n in self._counts.items())
        top = heapq.nlargest(self.top_n, rates)
        self.hot = frozenset(key for rate, key in top if rate >= self.threshold)
        self._answers = {k: v for k, v in self._answers.items() if k in self.hot}
        self._counts = {}
        self._second = second

    def lookup(self, ident: str) -> Result | None:
        """Count this Get; answer it from memory when the counter is hot and fresh."""
        now = self._clock()
        self._roll(now)
        counts = self._counts
        if ident in counts:
            counts[ident] += 1
        elif len(counts) < self.max_tracked:
            counts[ident] = 1
        found = self._answers.get(ident)
        if found is None:
            return None
        at, freq, end = found
        if now - at > self.ttl_s:
            del self._answers[ident]
            return None
        return Result(freq=freq, ttl_ms=max(0, int((end - now) * 1000)))

    def store(self, ident: str, result: Result) -> None:
        """Keep a store answer of a hot counter (called after Get and after a local Add)."""
        if ident in self.hot and (self.watched is None or ident in self.watched):
            now = self._clock()
            self._answers[ident] = (now, result.freq, now + result.ttl_ms / 1000)

    def invalidate(self, ident: str) -> None:
        self._answers.pop(ident, None)


async def follow_invalidations(
    client: Any, channel: str, hot: HotKeys, on_message: Callable[[], None] | None = None,
    poll_s: float = 0.1,
) -> None:
    """Subscribe to the channels of this replica's hot counters (following the hot set within
    `poll_s`) and drop entries other replicas changed; reconnects on errors, and clears every
    entry after a gap (messages may have been missed)."""
    idle = channel + "\x00idle"  # always subscribed: redis-py reads only while subscribed
    while True:
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        watched: frozenset[str] = frozenset()
        hot.watched = watched
        try:
            await pubsub.subscribe(idle)
            hot._answers.clear()
            while True:
                want = hot.hot
                if want != watched:
                    gone, new = watched - want, want - watched
                    hot.watched = watched = watched & want  # stop caching the cold ones first
                    if gone:
                        await pubsub.unsubscribe(*(channel + k for k in gone))
                    if new:
                        await pubsub.subscribe(*(channel + k for k in new))
                    hot.watched = watched = want  # subscribed: their changes reach us now
                msg = await pubsub.get_message(timeout=poll_s)
                if msg is None:
                    continue
                name = msg.get("channel")
                if isinstance(name, bytes):
                    name = name.decode("utf-8", "surrogateescape")
                if isinstance(name, str) and name.startswith(channel):
                    hot.invalidate(name[len(channel):])
                if on_message is not None:
                    on_message()
        except asyncio.CancelledError:
            hot.watched = frozenset()
            with contextlib.suppress(Exception):
                await pubsub.aclose()
            raise
        except Exception as exc:  # store away: resubscribe shortly
            log.debug("counters invalidation subscription lost: %s", exc)
            hot.watched = frozenset()
            hot._answers.clear()
            with contextlib.suppress(Exception):
                await pubsub.aclose()
            await asyncio.sleep(0.5)
