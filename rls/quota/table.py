"""One stream's buckets: opened (or adopted from an ended stream), matched against the config,
forgotten when unmatched or no longer listed.

Envoy lists every bucket it holds in every report (every 5 s), so a bucket not reported for
FORGET_AFTER_MS is gone on Envoy's side: `evict` drops it, oldest report first, one step per
bucket dropped. Dropping a bucket gives its reservation back to the counter.
"""

from __future__ import annotations

from collections import OrderedDict

from envoy.service.rate_limit_quota.v3 import rlqs_pb2

from rls.config.model import Domain, RateLimitConfig
from rls.engine.checks import match_targets
from rls.engine.rules import COUNTED, limit_role
from rls.quota.bucket import LIMITED, UNLIMITED, UNMATCHED, UNSUPPORTED, Bucket, BucketKey
from rls.quota.context import QuotaContext
from rls.quota.ledger import Ledger
from rls.quota.match import order_bucket
from rls.quota.pacing import REPORT_CADENCE_S
from rls.quota.share import undealable

FORGET_AFTER_MS = int(3 * REPORT_CADENCE_S * 1000)  # Envoy lists every bucket it holds
MAX_BUCKETS_PER_STREAM = 20_000


class BucketTable:
    def __init__(self, ctx: QuotaContext) -> None:
        self.ctx = ctx
        self.buckets: dict[BucketKey, Bucket] = {}
        self.id_bytes = 0  # bucket ids this stream keeps
        self._seen: OrderedDict[BucketKey, int] = OrderedDict()  # oldest report first

    def open(
        self, domain: str, bucket_id: rlqs_pb2.BucketId, key: BucketKey, size: int
    ) -> tuple[Bucket | None, bool]:
        """A bucket new to this stream: taken over from an ended stream (not new then: its
        reservation is settled like at any report), or made; None beyond the caps."""
        ctx = self.ctx
        if (
            len(self.buckets) >= MAX_BUCKETS_PER_STREAM
            or self.id_bytes + size > ctx.limits.stream_bucket_bytes
            or not ctx.ids.fits(size)
        ):
            ctx.metrics.errors.labels("bucket_cap").inc()
            return None, True
        bucket = ctx.orphans.adopt(domain, key)
        new = bucket is None
        if bucket is None:
            bucket = Bucket(bucket_id.SerializeToString(), key)
        ctx.ids.keep(bucket, size)
        self.id_bytes += size
        self.buckets[key] = bucket
        ctx.metrics.buckets.inc()
        return bucket, new

    def seen(self, key: BucketKey, now_ms: int) -> None:
        """Envoy reported bucket `key` at `now_ms`."""
        self._seen.pop(key, None)
        self._seen[key] = now_ms

    def resolve(
        self, bucket: Bucket, domain: str, config: RateLimitConfig | None, dom: Domain | None,
        items: dict[str, str],
    ) -> None:
        """(Re)match the bucket when the config snapshot changed; keep matching ledgers."""
        if bucket.config is config and config is not None:
            return
        if bucket.kind in (LIMITED, UNLIMITED):
            bucket.matched_before = True
        bucket.config = config
        old = {ledger.key: ledger for ledger in bucket.ledgers}
        ledgers = self._match(bucket, domain, dom, items, old)
        kept = {id(ledger) for ledger in ledgers}
        dealer = self.ctx.dealer
        for ledger in old.values():
            if id(ledger) not in kept:
                dealer.leave(ledger)
                self.ctx.background.spawn(dealer.release([ledger]))
        for ledger in ledgers:
            dealer.join(ledger)
        bucket.ledgers = ledgers

    def _match(
        self, bucket: Bucket, domain: str, dom: Domain | None, items: dict[str, str],
        old: dict[str, Ledger],
    ) -> list[Ledger]:
        """The bucket's ledgers, one per counted limit of its descriptor (rls.engine.rules),
        and its kind."""
        entries = order_bucket(dom, items) if dom is not None else None
        if entries is None or dom is None:
            bucket.kind = UNMATCHED
            return []
        targets = match_targets(dom, domain, entries, self.ctx.settings.key_prefix)
        replaced = {name for limit, *_ in targets for name in limit.replaces}
        ledgers = []
        for limit, key, dyn, _ in targets:
            if limit_role(limit, replaced) != COUNTED:
                continue
            why = undealable(limit)
            if why is not None:
                self.ctx.warn_unsupported(limit.full_key, why)
                bucket.kind = UNSUPPORTED
                return []
            ledger = old.get(key) or Ledger(limit, key, dyn)
            ledger.limit = limit
            ledgers.append(ledger)
        bucket.kind = LIMITED if ledgers else UNLIMITED
        return ledgers

    def forget(self, key: BucketKey) -> None:
        """Drop a bucket (unmatched now, or Envoy stopped listing it): its reservation goes
        back to the counter."""
        bucket = self.buckets.pop(key, None)
        self._seen.pop(key, None)
        if bucket is None:
            return
        ctx = self.ctx
        ctx.metrics.buckets.dec()
        self.id_bytes -= bucket.id_bytes
        ctx.ids.forget(bucket)
        bucket.due_ms = 0
        for ledger in bucket.ledgers:
            ctx.dealer.leave(ledger)
        if bucket.holds_reservation():
            ctx.orphans.release_later([bucket])

    def evict(self, now_ms: int) -> None:
        """Drop buckets Envoy stopped reporting: the oldest reports come first, so this costs
        one step per bucket dropped."""
        while self._seen:
            key, seen = next(iter(self._seen.items()))
            if now_ms - seen <= FORGET_AFTER_MS:
                return
            self.forget(key)

    def next_expiry(self) -> int | None:
        """Local-clock ms at which the least recently reported bucket expires (None: none)."""
        if not self._seen:
            return None
        return next(iter(self._seen.values())) + FORGET_AFTER_MS + 1

    def clear(self) -> list[tuple[BucketKey, Bucket]]:
        """The stream ended: every bucket, no longer dealing, for the caller to keep or give
        back (still counted in the bucket-id budget)."""
        buckets = list(self.buckets.items())
        self.buckets.clear()
        self._seen.clear()
        self.ctx.metrics.buckets.dec(len(buckets))
        for _, bucket in buckets:
            for ledger in bucket.ledgers:
                self.ctx.dealer.leave(ledger)
        return buckets
