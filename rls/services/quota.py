"""gRPC `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`.

Envoy's `rate_limit_quota` filter opens one stream per (rls cluster, domain), reports the usage
of every bucket it holds every 5 s (and once at once for a new bucket), and enforces whatever
we answer. Each report is answered at once; window resets are pushed without waiting for a
report. Bucket ids are matched against the domain's descriptors (rls.quota.match) and dealt
shares of the ShouldRateLimit counters (rls.quota.share). Facts about Envoy 1.40 this relies
on: reference/rlqs.md (TTLs and fill intervals in whole seconds, a blanket rule before a
changed token bucket so the new bucket starts full).

Answers per bucket:
- limited: DENY_ALL then a token bucket of the grant (TTL 12 s), or DENY_ALL until the window
  resets when nothing is left;
- unlimited: ALLOW_ALL (TTL 60 s);
- unmatched (no descriptor, unknown domain, or a limit quota mode cannot deal): the default
  action, ALLOW_ALL unless RLS_QUOTA_UNMATCHED=deny; a bucket that matched before a config
  reload and no longer does gets `abandon_action` (Envoy forgets it);
- a bucket id over RLS_QUOTA_BUCKET_ID_BYTES: `abandon_action`, nothing kept;
- store failure: the failure mode (allow / deny) for 6 s, retried at the next report.

Bounds (rls.quota.bounds): a report is worked through in slices of a few ms of the event loop;
answers a client has not read are capped in bytes per stream and over all streams (over the
cap the next report is not read, so gRPC flow control holds the client back; a stream stalled
that way is ended); bucket ids are capped in count and bytes; buckets Envoy stopped listing
expire on a timer. Every per-bucket step is O(1): window pushes come from a heap of due times,
expiry from the buckets in order of their last report.

Ends: a stream that ends leaves its buckets' reservations to the next stream of the same
bucket in this process (Envoy reconnects at its next report) for RLS_QUOTA_ADOPT_S, then gives
them back; a draining rls ends every stream at once, gives every reservation back and refuses
new streams (UNAVAILABLE), so Envoy's next report goes to a live process, which charges it.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import math
import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import grpc
from envoy.service.rate_limit_quota.v3 import rlqs_pb2
from google.protobuf.message import DecodeError
from prometheus_client import CollectorRegistry

from rls.config.model import Domain, RateLimitConfig
from rls.engine.candidates import CandidateReporter
from rls.engine.checks import match_targets
from rls.quota.actions import (
    ALLOW_ALL,
    ALLOW_TTL_S,
    DENY_ALL,
    FAILURE_TTL_S,
    TOKENS_TTL_S,
    Answer,
    abandon,
    blanket,
    tokens,
)
from rls.quota.bounds import QuotaBounds
from rls.quota.match import order_bucket
from rls.quota.metrics import QuotaMetrics
from rls.quota.outbox import Outbox, OutboxPool, Stalled
from rls.quota.share import (
    MAX_TOKENS,
    REPORT_CADENCE_S,
    Dealer,
    Grant,
    Ledger,
    demand_target,
    undealable,
)
from rls.settings import Settings
from rls.stores.base import Backend, BackendError

log = logging.getLogger("rls.quota")

SERVICE_NAME = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"
MAX_REPORTED = MAX_TOKENS  # requests of one bucket in one report, allowed or denied
METHOD_NAME = "StreamRateLimitQuotas"

PUSH_DELAY_MS = 30  # after a window's end, so the store's clock is surely in the new window
PUSH_RETRY_MS = 1000  # a push the store failed is tried again this much later
FORGET_AFTER_MS = int(3 * REPORT_CADENCE_S * 1000)  # Envoy lists every bucket it holds
MAX_BUCKETS_PER_STREAM = 20_000
SLICE_BUCKETS = 32  # buckets dealt concurrently (one pipelined Redis round trip) per slice
STORE_TIMEOUT_MS = 250  # off the request path: a report may wait longer than a decision
ROOM_POLL_S = 1.0  # a stream whose client does not read retries its window pushes this often
DRAIN_FLUSH_S = 1.0  # a draining stream's last answers get this long to go out

LIMITED, UNLIMITED, UNMATCHED, UNSUPPORTED = "limited", "unlimited", "unmatched", "unsupported"

BucketKey = tuple[tuple[str, str], ...]
AbortStatus = tuple[grpc.StatusCode, str]


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


class _StreamEnded(Exception):
    """The stream was ended (stalled, draining) while a report was being worked through."""


class _Slicer:
    """Tells a loop over buckets when it has held the event loop long enough."""

    def __init__(self, slice_ms: float) -> None:
        self.budget = slice_ms / 1000
        self.start = time.perf_counter()

    def over(self, jobs: int) -> bool:
        return jobs >= SLICE_BUCKETS or time.perf_counter() - self.start >= self.budget

    def restart(self) -> None:
        self.start = time.perf_counter()


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
        self._config = config
        self.settings = settings
        self.limits = limits or QuotaBounds.from_env()
        self.metrics = QuotaMetrics(registry)
        self.dealer = dealer or Dealer(backend, max(settings.backend_timeout_ms, STORE_TIMEOUT_MS))
        # Candidate limits are counted where their verdicts have somewhere to go (the server's
        # metrics and top talkers).
        self.candidates = candidates
        mode = unmatched or os.environ.get("RLS_QUOTA_UNMATCHED", "allow")
        if mode not in ("allow", "deny"):
            raise ValueError(f"RLS_QUOTA_UNMATCHED must be allow or deny, not {mode!r}")
        self.unmatched_rule = ALLOW_ALL if mode == "allow" else DENY_ALL
        self._warned: set[str] = set()
        self.streams: set[QuotaStream] = set()
        self.outboxes = OutboxPool(self.limits.queue_bytes, self.metrics.queued_bytes.inc)
        self.bucket_bytes = 0  # bucket ids kept over all streams (and orphans)
        self.draining = False
        # Buckets of ended streams, by (domain, bucket), until adopted or released.
        self.orphans: OrderedDict[tuple[str, BucketKey], tuple[float, Bucket]] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME, {METHOD_NAME: grpc.stream_stream_rpc_method_handler(self.stream)}
        )

    async def stream(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> None:
        if self.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                "rls is shutting down: report to another rls")
        session = QuotaStream(self)
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
            await context.abort(*status)

    def spawn(self, step: Awaitable[None]) -> None:
        task = asyncio.ensure_future(step)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- stream ends ----------------------------------------------------------------------------

    def orphan(self, domain: str, buckets: Iterable[tuple[BucketKey, Bucket]]) -> None:
        """Keep an ended stream's limited buckets for the next stream of the same bucket."""
        expires = time.monotonic() + self.limits.adopt_s
        kept = 0
        for key, bucket in buckets:
            if bucket.kind == LIMITED and any(ledger.reserved for ledger in bucket.ledgers):
                old = self.orphans.pop((domain, key), None)
                if old is not None:
                    self.forget_bytes(old[1])
                    self.spawn(self.release([old[1]]))
                self.orphans[(domain, key)] = (expires, bucket)
                kept += 1
            else:
                self.forget_bytes(bucket)
        if kept:
            loop = asyncio.get_running_loop()
            loop.call_later(self.limits.adopt_s + 0.05, self._expire_orphans)

    def adopt(self, domain: str, key: BucketKey) -> Bucket | None:
        entry = self.orphans.pop((domain, key), None)
        if entry is None:
            return None
        self.forget_bytes(entry[1])  # counted again by the stream that takes it
        entry[1].due_ms = 0  # not on the new stream's push heap yet
        for ledger in entry[1].ledgers:
            self.dealer.join(ledger)
        return entry[1]

    def _expire_orphans(self) -> None:
        now = time.monotonic()
        expired: list[Bucket] = []
        while self.orphans:
            key, (expires, bucket) = next(iter(self.orphans.items()))
            if expires > now:
                break
            del self.orphans[key]
            self.forget_bytes(bucket)
            expired.append(bucket)
        if expired:
            self.spawn(self.release(expired))

    def forget_bytes(self, bucket: Bucket) -> None:
        self.bucket_bytes -= bucket.id_bytes
        bucket.id_bytes = 0

    async def release(self, buckets: list[Bucket]) -> None:
        """Give back the reservations of `buckets` (ledgers already left the dealer), in
        slices; a store failure leaves them charged until their window ends (logged)."""
        failed: BaseException | None = None
        for start in range(0, len(buckets), SLICE_BUCKETS):
            chunk = buckets[start:start + SLICE_BUCKETS]
            results = await asyncio.gather(
                *(self.dealer.release(b.ledgers) for b in chunk), return_exceptions=True
            )
            failed = next((r for r in results if isinstance(r, BaseException)), None)
            if failed is not None:
                break  # the store is failing: the rest would only wait for it too
        if failed is not None:
            self.metrics.errors.labels("backend").inc()
            log.warning("quota: giving back reservations failed (%s); they stay charged until "
                        "their windows end", str(failed) or type(failed).__name__)

    async def drain(self) -> None:
        """SIGTERM: grant nothing more, end every stream now, give every reservation back.

        Envoy keeps enforcing what it holds (TTL) and sends its next report to whichever rls
        answers; that rls charges the usage. Refusing new streams here makes Envoy go there."""
        self.draining = True
        status = (grpc.StatusCode.UNAVAILABLE, "rls is shutting down: report to another rls")
        await asyncio.gather(*(session.finish(status) for session in list(self.streams)))
        while self.streams:  # each stream's close() gives its reservations back
            await asyncio.sleep(0.01)
        orphans = [bucket for _, bucket in self.orphans.values()]
        self.orphans.clear()
        for bucket in orphans:
            self.forget_bytes(bucket)
        await self.release(orphans)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def warn_unsupported(self, full_key: str, why: str) -> None:
        self.metrics.errors.labels("unsupported").inc()
        if full_key not in self._warned and len(self._warned) < 1000:
            self._warned.add(full_key)
            log.error(
                "quota mode cannot deal limit %s (%s): its buckets get the unmatched default",
                full_key, why,
            )


class QuotaStream:
    """One Envoy's stream: its buckets, their ledgers, and the answers queued for it."""

    def __init__(self, service: QuotaService) -> None:
        self.service = service
        self.limits = service.limits
        self.metrics = service.metrics
        self.dealer = service.dealer
        self.domain = ""
        self.buckets: dict[BucketKey, Bucket] = {}
        self.id_bytes = 0
        self._seen: OrderedDict[BucketKey, int] = OrderedDict()  # oldest report first
        self._due: list[tuple[int, int, BucketKey]] = []  # heap of (due ms, seq, bucket)
        self._seq = 0
        self._lock = asyncio.Lock()
        self._out = Outbox(service.outboxes, self.limits.stream_queue_bytes,
                           self.limits.stalled_s)
        self._wake = asyncio.Event()
        self._ended = asyncio.Event()
        self.status: AbortStatus | None = None
        self.warned_id = False
        self._finishing = False  # draining: no report is answered any more

    async def run(
        self, requests: AsyncIterator[bytes], write: Callable[[bytes], Awaitable[None]]
    ) -> AbortStatus | None:
        """Serve until the client ends or the stream is ended; the status to end with."""
        loop = asyncio.get_running_loop()
        tasks = [
            loop.create_task(self._read(requests)),
            loop.create_task(self._push_forever()),
            loop.create_task(self._write(write)),
        ]
        try:
            await self._ended.wait()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        return self.status

    def end(self, status: AbortStatus | None = None) -> None:
        if self.status is None:
            self.status = status
        self._ended.set()

    async def finish(self, status: AbortStatus) -> None:
        """Drain: answer nothing more; renew each token bucket Envoy holds as it is (an
        identical token bucket keeps its remaining tokens, and its TTL restarts: Envoy keeps
        enforcing what it has until its next report reaches a live rls), then end."""
        async with self._lock:
            self._finishing = True
            now = self.dealer.now_ms()
            answer = Answer(self.send)
            for bucket in self.buckets.values():
                current = all(ledger.end_ms > now for ledger in bucket.ledgers
                              if not ledger.shadow)
                if bucket.kind == LIMITED and bucket.granted > 0 and current:
                    answer.add(tokens(bucket.bucket_id, bucket.granted))
            answer.flush()
            if self.status is None:
                self.status = status
            self._out.close()  # the writer ends the stream once these went out
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DRAIN_FLUSH_S):
                await self._ended.wait()
        self.end(status)

    async def close(self) -> None:
        """After the stream: drop unsent answers; leave the buckets' reservations to the next
        stream (or, draining, give them back)."""
        self._out.drop()
        buckets = list(self.buckets.items())
        self.buckets.clear()
        self._seen.clear()
        self._due.clear()
        self.metrics.buckets.dec(len(buckets))
        for _, bucket in buckets:
            for ledger in bucket.ledgers:
                self.dealer.leave(ledger)
        if self.service.draining:
            for _, bucket in buckets:
                self.service.forget_bytes(bucket)
            await self.service.release([bucket for _, bucket in buckets])
        else:
            self.service.orphan(self.domain, buckets)

    async def _read(self, requests: AsyncIterator[bytes]) -> None:
        try:
            async for data in requests:
                try:
                    message = rlqs_pb2.RateLimitQuotaUsageReports.FromString(data)
                except DecodeError as exc:
                    self.metrics.errors.labels("invalid").inc()
                    log.info("malformed RateLimitQuotaUsageReports ignored: %s", exc)
                    continue
                del data
                await self.handle(message)
                await self._wait_room()
        except _StreamEnded:
            return
        except Exception:
            log.exception("quota stream (domain %r) failed; Envoy will reconnect", self.domain)
            self.end((grpc.StatusCode.INTERNAL, "rls failed on this stream; see its log"))
            return
        self._out.close()

    async def _write(self, write: Callable[[bytes], Awaitable[None]]) -> None:
        while (data := await self._out.next()) is not None:
            await write(data)
            self._out.taken()
        self.end()  # the client ended its side and every answer went out

    def send(self, data: bytes) -> None:
        self._out.put(data)

    def _end_stalled(self) -> None:
        self.metrics.errors.labels("stalled").inc()
        log.warning("quota stream (domain %r) ended: %d bytes of answers unread for %g s",
                    self.domain, self._out.bytes, self.limits.stalled_s)
        self.end((grpc.StatusCode.RESOURCE_EXHAUSTED,
                  f"answers unread for {self.limits.stalled_s:g} s (RLS_QUOTA_STALLED_S); "
                  "read them to keep the stream"))

    async def _wait_room(self) -> None:
        """Flow control: read nothing more while this stream's unread answers, or all streams'
        together, are over their caps; end the stream when its client stopped reading."""
        if self._ended.is_set():
            raise _StreamEnded
        try:
            await self._out.room()
        except Stalled:
            self._end_stalled()
            raise _StreamEnded from None
        if self._ended.is_set():
            raise _StreamEnded

    async def _breathe(self, slicer: _Slicer) -> None:
        """Between slices: let every other caller run, and respect the queue caps."""
        await asyncio.sleep(0)
        await self._wait_room()
        slicer.restart()

    # ------------------------------------------------------------------ reports

    async def handle(self, message: rlqs_pb2.RateLimitQuotaUsageReports) -> None:
        """Answer one usage report (every bucket in it) with one response (or several)."""
        self.metrics.reports.inc()
        if message.domain:
            self.domain = message.domain
        if not self.domain:
            self.metrics.errors.labels("invalid").inc()
            log.info("RLQS report without a domain ignored")
            return
        answer = Answer(self.send)
        async with self._lock:
            if self._finishing:
                return
            await self._answer(message, answer)
        answer.flush()
        self._wake.set()

    async def _answer(self, message: rlqs_pb2.RateLimitQuotaUsageReports, answer: Answer) -> None:
        now = self.dealer.now_ms()
        config = self.service._config()
        dom = config.domains.get(self.domain) if config is not None else None
        jobs: list[tuple[Bucket, Awaitable[Grant]]] = []
        in_message: set[BucketKey] = set()
        slicer = _Slicer(self.limits.slice_ms)
        for usage in message.bucket_quota_usages:
            if slicer.over(len(jobs)):
                await self._deal(jobs, dom, answer)
                jobs = []
                await self._breathe(slicer)
            job = self._take(usage, now, config, dom, answer, in_message)
            if job is not None:
                jobs.append(job)
        await self._deal(jobs, dom, answer)

    def _take(
        self,
        usage: rlqs_pb2.RateLimitQuotaUsageReports.BucketQuotaUsage,
        now: int,
        config: RateLimitConfig | None,
        dom: Domain | None,
        answer: Answer,
        in_message: set[BucketKey],
    ) -> tuple[Bucket, Awaitable[Grant]] | None:
        """One bucket of a report: answered now, or its store job for the slice's deal."""
        size = usage.bucket_id.ByteSize()
        if size > self.limits.bucket_id_bytes:
            self._refuse(usage.bucket_id, size, answer)
            return None
        items = dict(usage.bucket_id.bucket)
        if not items:
            self.metrics.errors.labels("invalid").inc()
            return None
        key: BucketKey = tuple(sorted(items.items()))
        if key in in_message:  # Envoy lists a bucket once; a repeat would race itself
            self.metrics.errors.labels("invalid").inc()
            return None
        in_message.add(key)
        bucket = self.buckets.get(key)
        new = bucket is None
        if bucket is None:
            bucket, new = self._open(usage.bucket_id, key, size)
            if bucket is None:
                answer.add(blanket(usage.bucket_id, self._failure_rule(dom), FAILURE_TTL_S))
                return None
        self._seen.pop(key, None)
        self._seen[key] = now
        self._resolve(bucket, config, dom, items)
        allowed, denied = self._reported(usage)
        self._count_usage(bucket, allowed, denied)
        if bucket.kind == UNMATCHED or bucket.kind == UNSUPPORTED:
            if bucket.matched_before:
                answer.add(abandon(bucket.bucket_id))
                self.metrics.actions["abandon"].inc()
                self._forget(key)
            else:
                answer.add(blanket(bucket.bucket_id, self.service.unmatched_rule, ALLOW_TTL_S))
                self._count_rule(self.service.unmatched_rule)
            return None
        if bucket.kind == UNLIMITED:
            answer.add(blanket(bucket.bucket_id, ALLOW_ALL, ALLOW_TTL_S))
            self._count_rule(ALLOW_ALL)
            return None
        elapsed = usage.time_elapsed.seconds + usage.time_elapsed.nanos / 1e9
        if elapsed <= 0:  # Envoy's immediate report of a bucket new to it: demand unknown
            bucket.target = None
        else:
            span = elapsed if new or not bucket.last_report_ms else (
                (now - bucket.last_report_ms) / 1000
            )
            bucket.target = demand_target(allowed + denied, span)
        last, bucket.last_report_ms = bucket.last_report_ms, now
        counted = dom is not None and dom.has_candidates and self.service.candidates is not None
        demand = allowed + denied if counted else 0
        return bucket, self.dealer.report(bucket.ledgers, allowed, bucket.target, last, demand)

    def _reported(
        self, usage: rlqs_pb2.RateLimitQuotaUsageReports.BucketQuotaUsage
    ) -> tuple[int, int]:
        """(allowed, denied) of a bucket's report, each at most MAX_REPORTED.

        They are uint64 on the wire. No Envoy admits 2^32 requests of a bucket in one report
        period; charging such a count would push a Redis counter out of its integer range (the
        bucket then failed every report until the window ended).
        """
        allowed, denied = usage.num_requests_allowed, usage.num_requests_denied
        if allowed > MAX_REPORTED or denied > MAX_REPORTED:
            self.metrics.errors.labels("invalid").inc()
            allowed, denied = min(allowed, MAX_REPORTED), min(denied, MAX_REPORTED)
        return allowed, denied

    def _refuse(self, bucket_id: rlqs_pb2.BucketId, size: int, answer: Answer) -> None:
        """A bucket id over the byte cap: Envoy is told to forget it; nothing is kept."""
        self.metrics.errors.labels("bucket_id_size").inc()
        if not self.warned_id:
            self.warned_id = True
            log.warning("quota: bucket id of %d bytes refused (abandon_action; limit "
                        "RLS_QUOTA_BUCKET_ID_BYTES=%d), domain %r", size,
                        self.limits.bucket_id_bytes, self.domain)
        answer.add(abandon(bucket_id))
        self.metrics.actions["abandon"].inc()

    def _open(
        self, bucket_id: rlqs_pb2.BucketId, key: BucketKey, size: int
    ) -> tuple[Bucket | None, bool]:
        """A bucket new to this stream: taken over from an ended stream (not new then: its
        reservation is settled like at any report), or made; None beyond the caps."""
        if (
            len(self.buckets) >= MAX_BUCKETS_PER_STREAM
            or self.id_bytes + size > self.limits.stream_bucket_bytes
            or self.service.bucket_bytes + size > self.limits.bucket_bytes
        ):
            self.metrics.errors.labels("bucket_cap").inc()
            return None, True
        bucket = self.service.adopt(self.domain, key)
        new = bucket is None
        if bucket is None:
            bucket = Bucket(bucket_id.SerializeToString(), key)
        bucket.id_bytes = size
        self.id_bytes += size
        self.service.bucket_bytes += size
        self.buckets[key] = bucket
        self.metrics.buckets.inc()
        return bucket, new

    async def _deal(
        self,
        jobs: list[tuple[Bucket, Awaitable[Grant]]],
        dom: Domain | None,
        answer: Answer,
    ) -> None:
        """Run the buckets' store steps concurrently (pipelined on Redis), add the answers."""
        if not jobs:
            return
        results = await asyncio.gather(*(job for _, job in jobs), return_exceptions=True)
        failed: BaseException | None = None
        failures = 0
        now = self.dealer.now_ms()
        for (bucket, _), result in zip(jobs, results, strict=True):
            if isinstance(result, Grant):
                if result.candidates:
                    self._report_candidates(bucket, dom, result)
                self._append_grant(answer, bucket, result)
                self._schedule(bucket, now)
            elif isinstance(result, (BackendError, TimeoutError)):
                failed, failures = result, failures + 1
                self.metrics.errors.labels("backend").inc()
                rule = self._failure_rule(dom)
                answer.add(blanket(bucket.bucket_id, rule, FAILURE_TTL_S))
                bucket.granted = 0
                self._count_rule(rule)
                self._schedule(bucket, now + PUSH_RETRY_MS)
            elif isinstance(result, BaseException):
                raise result  # a bug: end the stream rather than answer wrongly
        if failed is not None:  # one line per slice, not per bucket
            log.warning("quota: store failed for %d bucket(s) of domain %r, failure mode for "
                        "%ss: %s", failures, self.domain, FAILURE_TTL_S,
                        str(failed) or type(failed).__name__)

    def _append_grant(self, answer: Answer, bucket: Bucket, grant: Grant) -> None:
        settings = self.service.settings
        bucket.granted = grant.tokens
        if settings.limiting_off or settings.shadow_mode or self.domain in settings.shadow_domains:
            answer.add(blanket(bucket.bucket_id, ALLOW_ALL, TOKENS_TTL_S))
            bucket.granted = 0
            self._count_rule(ALLOW_ALL)
            return
        if grant.tokens > 0:
            # A blanket rule first: Envoy then starts the token bucket full instead of carrying
            # the old bucket's fill ratio over (reference/rlqs.md).
            bucket_id = bucket.bucket_id
            answer.add(blanket(bucket_id, DENY_ALL, TOKENS_TTL_S),
                       tokens(bucket_id, grant.tokens))
            self.metrics.actions["token_bucket"].inc()
        else:
            ttl = max(math.ceil(grant.reset_ms / 1000), TOKENS_TTL_S)
            answer.add(blanket(bucket.bucket_id, DENY_ALL, ttl))
            self._count_rule(DENY_ALL)

    def _report_candidates(self, bucket: Bucket, dom: Domain | None, grant: Grant) -> None:
        reporter = self.service.candidates
        if reporter is None:
            return

        def entries() -> Iterable[tuple[str, str]]:
            ordered = order_bucket(dom, dict(bucket.key)) if dom is not None else None
            return ordered or bucket.key

        for check, out in grant.candidates:
            reporter.batch(self.domain, entries, check, out)

    def _failure_rule(self, dom: Domain | None) -> int:
        mode = (dom.failure_mode if dom is not None else None) or self.service.settings.failure_mode
        return int(ALLOW_ALL if mode == "allow" else DENY_ALL)

    def _count_rule(self, rule: int) -> None:
        self.metrics.actions["allow_all" if rule == ALLOW_ALL else "deny_all"].inc()

    def _count_usage(self, bucket: Bucket, allowed: int, denied: int) -> None:
        if not allowed and not denied:
            return
        names = [ledger.limit.full_key for ledger in bucket.ledgers] or [f"_{bucket.kind}"]
        if bucket.kind != LIMITED:
            names = [f"_{bucket.kind}"]
        for name in names:
            if allowed:
                self.metrics.count_usage(name, "allowed", allowed)
            if denied:
                self.metrics.count_usage(name, "denied", denied)

    def _resolve(
        self, bucket: Bucket, config: RateLimitConfig | None, dom: Domain | None,
        items: dict[str, str],
    ) -> None:
        """(Re)match the bucket when the config snapshot changed; keep matching ledgers."""
        if bucket.config is config and config is not None:
            return
        if bucket.kind in (LIMITED, UNLIMITED):
            bucket.matched_before = True
        bucket.config = config
        old = {ledger.key: ledger for ledger in bucket.ledgers}
        ledgers = self._match(bucket, dom, items, old)
        kept = {id(ledger) for ledger in ledgers}
        for ledger in old.values():
            if id(ledger) not in kept:
                self.dealer.leave(ledger)
                self.service.spawn(self.dealer.release([ledger]))
        for ledger in ledgers:
            self.dealer.join(ledger)
        bucket.ledgers = ledgers

    def _match(
        self, bucket: Bucket, dom: Domain | None, items: dict[str, str], old: dict[str, Ledger]
    ) -> list[Ledger]:
        entries = order_bucket(dom, items) if dom is not None else None
        if entries is None or dom is None:
            bucket.kind = UNMATCHED
            return []
        prefix = self.service.settings.key_prefix
        targets = match_targets(dom, self.domain, entries, prefix)
        replaced = {name for limit, *_ in targets for name in limit.replaces}
        ledgers = []
        for limit, key, dyn, _ in targets:
            if limit.unlimited or (limit.name and limit.name in replaced):
                continue
            why = undealable(limit)
            if why is not None:
                self.service.warn_unsupported(limit.full_key, why)
                bucket.kind = UNSUPPORTED
                return []
            ledger = old.get(key) or Ledger(limit, key, dyn)
            ledger.limit = limit
            ledgers.append(ledger)
        bucket.kind = LIMITED if ledgers else UNLIMITED
        return ledgers

    def _forget(self, key: BucketKey) -> None:
        """Drop a bucket (unmatched now, or Envoy stopped listing it): its reservation goes
        back to the counter."""
        bucket = self.buckets.pop(key, None)
        self._seen.pop(key, None)
        if bucket is None:
            return
        self.metrics.buckets.dec()
        self.id_bytes -= bucket.id_bytes
        self.service.forget_bytes(bucket)
        bucket.due_ms = 0
        for ledger in bucket.ledgers:
            self.dealer.leave(ledger)
        if any(ledger.reserved for ledger in bucket.ledgers):
            self.service.spawn(self.service.release([bucket]))

    def _evict(self, now: int) -> None:
        """Drop buckets Envoy stopped reporting (it lists all it holds every 5 s): the oldest
        reports come first, so this costs one step per bucket dropped."""
        while self._seen:
            key, seen = next(iter(self._seen.items()))
            if now - seen <= FORGET_AFTER_MS:
                return
            self._forget(key)

    # ------------------------------------------------------------------ window pushes

    def _schedule(self, bucket: Bucket, not_before: int) -> None:
        """Put the bucket on the push heap at its next window end (once per window)."""
        ends = [ledger.end_ms for ledger in bucket.ledgers if ledger.end_ms and not ledger.shadow]
        if bucket.kind != LIMITED or not ends:
            return
        due = max(min(ends) + PUSH_DELAY_MS, not_before)
        if bucket.due_ms and due >= bucket.due_ms - PUSH_DELAY_MS:
            return  # already on the heap for (about) this time; re-checked when it fires
        bucket.due_ms = due
        self._seq += 1
        heapq.heappush(self._due, (due, self._seq, bucket.key))

    def _deadline(self) -> float | None:
        """Local-clock ms of the pusher's next job: a window push, an expiry, a stall check."""
        times: list[float] = []
        if self._due:
            times.append(self._due[0][0])
        if self._seen:
            times.append(next(iter(self._seen.values())) + FORGET_AFTER_MS + 1)
        stall = self._out.stall_deadline()
        if stall is not None:
            times.append(self.dealer.now_ms() + max(stall - time.monotonic(), 0) * 1000 + 1)
        return min(times) if times else None

    async def _push_forever(self) -> None:
        """Window pushes, idle expiry and the stall check, each when it falls due."""
        while True:
            self._wake.clear()
            deadline = self._deadline()
            timeout = None if deadline is None else max(0.0, (deadline - self.dealer.now_ms())
                                                        / 1000)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
                    continue
            if self._out.over():  # the client is not reading: pushes wait, a stall ends it
                if self._out.stalled():
                    self._end_stalled()
                    return
                await asyncio.sleep(ROOM_POLL_S)
                continue
            async with self._lock:
                self._evict(self.dealer.now_ms())
            await self.push_due()

    def _take_due(self, now: int) -> list[Bucket]:
        due: list[Bucket] = []
        while self._due and self._due[0][0] <= now:
            when, _, key = heapq.heappop(self._due)
            bucket = self.buckets.get(key)
            if bucket is None or bucket.due_ms != when:
                continue  # forgotten, or rescheduled since
            bucket.due_ms = 0
            if bucket.kind != LIMITED:
                continue
            if any(ledger.end_ms and now >= ledger.end_ms for ledger in bucket.ledgers):
                due.append(bucket)
            else:
                self._schedule(bucket, now)
        return due

    async def push_due(self) -> None:
        """Deal the new window's grant to every bucket whose window ended, in slices."""
        answer = Answer(self.send)
        try:
            async with self._lock:
                if self._finishing:
                    return
                due = self._take_due(self.dealer.now_ms())
                if not due:
                    return
                config = self.service._config()
                dom = config.domains.get(self.domain) if config is not None else None
                slicer = _Slicer(self.limits.slice_ms)
                jobs: list[tuple[Bucket, Awaitable[Grant]]] = []
                for bucket in due:
                    if slicer.over(len(jobs)):
                        await self._deal(jobs, dom, answer)
                        jobs = []
                        await self._breathe(slicer)
                    jobs.append((bucket, self.dealer.push(bucket.ledgers, bucket.target)))
                await self._deal(jobs, dom, answer)
        except _StreamEnded:
            return
        answer.flush()

