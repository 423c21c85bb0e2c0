"""What every stream of one quota service shares: config, settings, bounds, metrics, the
dealer, the bucket-id budget, ended streams' buckets and background steps.

One explicit object, built by the servicer (rls.services.quota) and handed to each stream and
its parts, so none of them reaches into the servicer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from rls.config.model import Domain, RateLimitConfig
from rls.engine.candidates import CandidateReporter
from rls.quota.bounds import QuotaBounds
from rls.quota.bucket import IdBytes
from rls.quota.metrics import QuotaMetrics
from rls.quota.orphans import Orphans
from rls.quota.outbox import OutboxPool
from rls.quota.share import Dealer
from rls.quota.tasks import Background
from rls.settings import Settings

log = logging.getLogger("rls.quota")

MAX_WARNED = 1000  # limits named in an "unsupported" error line, once each


@dataclass(slots=True)
class QuotaContext:
    config: Callable[[], RateLimitConfig | None]
    settings: Settings
    limits: QuotaBounds
    metrics: QuotaMetrics
    dealer: Dealer
    # Candidate limits are counted where their verdicts have somewhere to go (the server's
    # metrics and top talkers); None: not counted.
    candidates: CandidateReporter | None
    unmatched_rule: int  # ALLOW_ALL or DENY_ALL (RLS_QUOTA_UNMATCHED)
    outboxes: OutboxPool
    ids: IdBytes
    background: Background
    orphans: Orphans
    draining: bool = False  # streams ending now give their reservations back, none is kept
    _warned: set[str] = field(default_factory=set)

    def snapshot(self, domain: str) -> tuple[RateLimitConfig | None, Domain | None]:
        """The current config and `domain` in it (None when unknown or nothing loaded)."""
        config = self.config()
        return config, config.domains.get(domain) if config is not None else None

    def warn_unsupported(self, full_key: str, why: str) -> None:
        self.metrics.errors.labels("unsupported").inc()
        if full_key not in self._warned and len(self._warned) < MAX_WARNED:
            self._warned.add(full_key)
            log.error(
                "quota mode cannot deal limit %s (%s): its buckets get the unmatched default",
                full_key, why,
            )
