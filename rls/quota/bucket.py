"""One RLQS bucket as a stream holds it, and the byte budget all streams' bucket ids share."""

from __future__ import annotations

from dataclasses import dataclass, field

from envoy.service.rate_limit_quota.v3 import rlqs_pb2

from rls.quota.ledger import Ledger

# What a bucket's match made of it (`Bucket.kind`).
LIMITED, UNLIMITED, UNMATCHED, UNSUPPORTED = "limited", "unlimited", "unmatched", "unsupported"

BucketKey = tuple[tuple[str, str], ...]


@dataclass(slots=True)
class Bucket:
    # The id as Envoy sent it, kept as bytes: a message object per bucket would be one more
    # object for every garbage collection to walk (see docs/reliability.md "Quota streams").
    id_wire: bytes
    key: BucketKey = ()
    id_bytes: int = 0
    kind: str = UNMATCHED
    ledgers: list[Ledger] = field(default_factory=list)
    config: object = None  # the config snapshot `kind` and `ledgers` come from
    matched_before: bool = False
    last_report_ms: int = 0
    target: int | None = None  # demand over one horizon from the last report (None: unknown)
    due_ms: int = 0  # when the pusher looks at this bucket next (0: not scheduled)
    granted: int = 0  # tokens of the token bucket last sent (0: none, or a blanket rule)

    @property
    def bucket_id(self) -> rlqs_pb2.BucketId:
        return rlqs_pb2.BucketId.FromString(self.id_wire)

    def holds_reservation(self) -> bool:
        return any(ledger.reserved for ledger in self.ledgers)


class IdBytes:
    """The bytes of bucket ids kept over all streams and orphans (RLS_QUOTA_BUCKET_BYTES)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.used = 0

    def fits(self, size: int) -> bool:
        return self.used + size <= self.cap

    def keep(self, bucket: Bucket, size: int) -> None:
        bucket.id_bytes = size
        self.used += size

    def forget(self, bucket: Bucket) -> None:
        self.used -= bucket.id_bytes
        bucket.id_bytes = 0
