"""gRPC `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`.

Envoy's `rate_limit_quota` filter opens one stream per (rls cluster, domain), reports the usage
of every bucket it holds every 5 s (and once at once for a new bucket), and enforces whatever
we answer. Each report is answered at once; window resets are pushed without waiting for a
report. Bucket ids are matched against the domain's descriptors (rls.quota.match) and dealt
shares of the ShouldRateLimit counters (rls.quota.share). What Envoy 1.40 does with the
answers, which this relies on, is in rls.quota.actions (TTLs and fill intervals in whole
seconds, a blanket rule before a changed token bucket so the new bucket starts full).

This module is the servicer only: the handler, each stream's lifetime and the drain. The
stream itself (reading, slicing, answering) is rls.quota.stream; its buckets rls.quota.table;
the answers rls.quota.respond; window pushes rls.quota.pushes; ended streams' buckets
rls.quota.orphans; the bounds rls.quota.bounds.

Ends: a stream that ends leaves its buckets' reservations to the next stream of the same
bucket in this process (Envoy reconnects at its next report) for RLS_QUOTA_ADOPT_S, then gives
them back; a draining rls ends every stream at once, gives every reservation back and refuses
new streams (UNAVAILABLE), so Envoy's next report goes to a live process, which charges it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import grpc
from prometheus_client import CollectorRegistry

from rls.config.model import RateLimitConfig
from rls.engine.candidates import CandidateReporter
from rls.quota.actions import ALLOW_ALL, DENY_ALL
from rls.quota.bounds import QuotaBounds
from rls.quota.bucket import IdBytes
from rls.quota.context import QuotaContext
from rls.quota.metrics import QuotaMetrics
from rls.quota.orphans import Orphans
from rls.quota.outbox import OutboxPool
from rls.quota.share import Dealer
from rls.quota.stream import AbortStatus, QuotaStream
from rls.quota.tasks import Background
from rls.settings import Settings
from rls.settings.environment import quota_unmatched
from rls.stores.base import Backend

log = logging.getLogger("rls.quota")

__all__ = ["SERVICE_NAME", "STORE_TIMEOUT_MS", "QuotaService", "QuotaStream"]

SERVICE_NAME = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"
METHOD_NAME = "StreamRateLimitQuotas"
STORE_TIMEOUT_MS = 250  # off the request path: a report may wait longer than a decision
SHUTTING_DOWN: AbortStatus = (
    grpc.StatusCode.UNAVAILABLE, "rls is shutting down: report to another rls"
)


class QuotaService:
    """Serves RLQS streams; shares config, store and counters with ShouldRateLimit."""

    def __init__(
        self,
        config: Callable[[], RateLimitConfig | None],
        backend: Backend,
        settings: Settings,
        registry: CollectorRegistry,
        unmatched: str | None = None,
        dealer: Dealer | None = None,
        limits: QuotaBounds | None = None,
        candidates: CandidateReporter | None = None,
    ) -> None:
        limits = limits or QuotaBounds.from_env()
        metrics = QuotaMetrics(registry)
        dealer = dealer or Dealer(backend, max(settings.backend_timeout_ms, STORE_TIMEOUT_MS))
        mode = unmatched or quota_unmatched()
        if mode not in ("allow", "deny"):
            raise ValueError(f"RLS_QUOTA_UNMATCHED must be allow or deny, not {mode!r}")
        ids = IdBytes(limits.bucket_bytes)
        background = Background()
        self.context = QuotaContext(
            config=config,
            settings=settings,
            limits=limits,
            metrics=metrics,
            dealer=dealer,
            candidates=candidates,
            unmatched_rule=ALLOW_ALL if mode == "allow" else DENY_ALL,
            outboxes=OutboxPool(limits.queue_bytes, metrics.queued_bytes.inc),
            ids=ids,
            background=background,
            orphans=Orphans(dealer, metrics, ids, background, limits.adopt_s),
        )
        self.metrics = metrics
        self.dealer = dealer
        self.orphans = self.context.orphans
        self.outboxes = self.context.outboxes
        self.background = background
        self.streams: set[QuotaStream] = set()

    @property
    def bucket_bytes(self) -> int:
        """Bytes of bucket ids kept over all streams and orphans."""
        return self.context.ids.used

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME, {METHOD_NAME: grpc.stream_stream_rpc_method_handler(self.stream)}
        )

    async def stream(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> None:
        if self.context.draining:
            await context.abort(*SHUTTING_DOWN)
        session = QuotaStream(self.context)
        self.streams.add(session)
        self.metrics.streams.inc()
        try:
            status = await session.run(requests, context.write)
        finally:
            try:
                await session.close()
            finally:
                self.streams.discard(session)  # after close: drain() waits for the release
                self.metrics.streams.dec()
        if status is not None:
            try:
                await context.abort(*status)
            except grpc.aio.InternalError:
                # The client went away before the status could go out: a stalled client that
                # never read its answers holds the status back until it disconnects.
                log.info("quota stream ended (%s) after its client went away", status[0].name)

    async def drain(self) -> None:
        """SIGTERM: grant nothing more, end every stream now, give every reservation back.

        Envoy keeps enforcing what it holds (TTL) and sends its next report to whichever rls
        answers; that rls charges the usage. Refusing new streams here makes Envoy go there."""
        self.context.draining = True
        await asyncio.gather(*(session.finish(SHUTTING_DOWN) for session in list(self.streams)))
        while self.streams:  # each stream's close() gives its reservations back
            await asyncio.sleep(0.01)
        await self.orphans.give_back(self.orphans.take_all())
        await self.background.wait()
