"""When a stream's buckets get a fresh grant without waiting for a report: window ends.

Without a push a spent bucket would stay denied up to 5 s (until its next report) into the new
window. Each limited bucket sits on a heap at its tightest window's end (plus PUSH_DELAY_MS, so
the store's clock is surely in the new window), once per window: taking what is due costs
O(log n) per bucket due, whatever the stream holds.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from rls.quota.bucket import LIMITED, Bucket, BucketKey

PUSH_DELAY_MS = 30  # after a window's end, so the store's clock is surely in the new window
PUSH_RETRY_MS = 1000  # a push the store failed is tried again this much later


class PushSchedule:
    def __init__(self) -> None:
        self._due: list[tuple[int, int, BucketKey]] = []  # heap of (due ms, seq, bucket)
        self._seq = 0

    def schedule(self, bucket: Bucket, not_before: int) -> None:
        """Put the bucket on the heap at its next window end (once per window)."""
        ends = [ledger.end_ms for ledger in bucket.ledgers if ledger.end_ms and not ledger.shadow]
        if bucket.kind != LIMITED or not ends:
            return
        due = max(min(ends) + PUSH_DELAY_MS, not_before)
        if bucket.due_ms and due >= bucket.due_ms - PUSH_DELAY_MS:
            return  # already on the heap for (about) this time; re-checked when it fires
        bucket.due_ms = due
        self._seq += 1
        heapq.heappush(self._due, (due, self._seq, bucket.key))

    def next_due(self) -> int | None:
        """Local-clock ms of the earliest entry (None: nothing scheduled)."""
        return self._due[0][0] if self._due else None

    def take_due(
        self, now_ms: int, lookup: Callable[[BucketKey], Bucket | None]
    ) -> list[Bucket]:
        """The buckets (found by `lookup`) whose window ended by `now_ms`; an entry of a bucket
        forgotten or rescheduled since is dropped, one not yet past its window put back."""
        due: list[Bucket] = []
        while self._due and self._due[0][0] <= now_ms:
            when, _, key = heapq.heappop(self._due)
            bucket = lookup(key)
            if bucket is None or bucket.due_ms != when:
                continue  # forgotten, or rescheduled since
            bucket.due_ms = 0
            if bucket.kind != LIMITED:
                continue
            if any(ledger.end_ms and now_ms >= ledger.end_ms for ledger in bucket.ledgers):
                due.append(bucket)
            else:
                self.schedule(bucket, now_ms)
        return due

    def clear(self) -> None:
        self._due.clear()
