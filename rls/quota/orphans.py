"""Buckets of ended streams, kept for the next stream of the same bucket, and giving back
what buckets hold.

Envoy reconnects at its next report (5 s) after a stream ends; its next stream of the same
bucket adopts the ended stream's bucket and reservation (`adopt`), so a reconnection neither
frees tokens Envoy still holds nor leaves them locked. A bucket nobody adopts within
RLS_QUOTA_ADOPT_S is released: its reservation goes back to the counter.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable

from rls.quota.bounds import SLICE_BUCKETS
from rls.quota.bucket import LIMITED, Bucket, BucketKey, IdBytes
from rls.quota.metrics import QuotaMetrics
from rls.quota.share import Dealer
from rls.quota.tasks import Background

log = logging.getLogger("rls.quota")


async def give_back(dealer: Dealer, metrics: QuotaMetrics, buckets: list[Bucket]) -> None:
    """Give back the reservations of `buckets` (ledgers already left the dealer), in slices;
    a store failure leaves them charged until their window ends (logged)."""
    failed: BaseException | None = None
    for start in range(0, len(buckets), SLICE_BUCKETS):
        chunk = buckets[start:start + SLICE_BUCKETS]
        results = await asyncio.gather(
            *(dealer.release(b.ledgers) for b in chunk), return_exceptions=True
        )
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:
            break  # the store is failing: the rest would only wait for it too
    if failed is not None:
        metrics.errors.labels("backend").inc()
        log.warning("quota: giving back reservations failed (%s); they stay charged until "
                    "their windows end", str(failed) or type(failed).__name__)


class Orphans:
    """Ended streams' limited buckets by (domain, bucket), oldest first, until adopted or
    released."""

    def __init__(
        self, dealer: Dealer, metrics: QuotaMetrics, ids: IdBytes, background: Background,
        adopt_s: float,
    ) -> None:
        self.dealer = dealer
        self.metrics = metrics
        self.ids = ids
        self.background = background
        self.adopt_s = adopt_s
        self._held: OrderedDict[tuple[str, BucketKey], tuple[float, Bucket]] = OrderedDict()

    def __bool__(self) -> bool:
        return bool(self._held)

    def buckets(self) -> list[Bucket]:
        return [bucket for _, bucket in self._held.values()]

    async def give_back(self, buckets: list[Bucket]) -> None:
        await give_back(self.dealer, self.metrics, buckets)

    def release_later(self, buckets: list[Bucket]) -> None:
        """Give `buckets`' reservations back in the background."""
        self.background.spawn(self.give_back(buckets))

    def keep(self, domain: str, buckets: Iterable[tuple[BucketKey, Bucket]]) -> None:
        """Keep an ended stream's limited buckets holding a reservation; forget the others."""
        expires = time.monotonic() + self.adopt_s
        kept = 0
        for key, bucket in buckets:
            if bucket.kind == LIMITED and bucket.holds_reservation():
                old = self._held.pop((domain, key), None)
                if old is not None:
                    self.ids.forget(old[1])
                    self.release_later([old[1]])
                self._held[(domain, key)] = (expires, bucket)
                kept += 1
            else:
                self.ids.forget(bucket)
        if kept:
            loop = asyncio.get_running_loop()
            loop.call_later(self.adopt_s + 0.05, self._expire)

    def adopt(self, domain: str, key: BucketKey) -> Bucket | None:
        """The ended stream's bucket `key` of `domain`, its ledgers dealing again, or None."""
        entry = self._held.pop((domain, key), None)
        if entry is None:
            return None
        bucket = entry[1]
        self.ids.forget(bucket)  # counted again by the stream that takes it
        bucket.due_ms = 0  # not on the new stream's push heap yet
        for ledger in bucket.ledgers:
            self.dealer.join(ledger)
        return bucket

    def _expire(self) -> None:
        now = time.monotonic()
        expired: list[Bucket] = []
        while self._held:
            key, (expires, bucket) = next(iter(self._held.items()))
            if expires > now:
                break
            del self._held[key]
            self.ids.forget(bucket)
            expired.append(bucket)
        if expired:
            self.release_later(expired)

    def take_all(self) -> list[Bucket]:
        """Draining: every bucket kept, no longer counted, for the caller to give back."""
        buckets = self.buckets()
        self._held.clear()
        for bucket in buckets:
            self.ids.forget(bucket)
        return buckets
