"""One Envoy's RLQS stream: reading its usage reports, answering each, pushing fresh grants
at window ends, and holding its answers until the client reads them.

A report is worked through in slices (at most SLICE_BUCKETS buckets and a few ms of the event
loop, RLS_QUOTA_SLICE_MS), so other callers never wait long behind a report of thousands of
buckets. Answers the client has not read are capped (rls.quota.outbox): over the cap the next
report is not read, so gRPC flow control holds the client back; a stream stalled that way is
ended. Each bucket's table entry, match and expiry are rls.quota.table; its answers
rls.quota.respond; its window pushes rls.quota.pushes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeAlias

import grpc
from envoy.service.rate_limit_quota.v3 import rlqs_pb2
from google.protobuf.message import DecodeError

from rls.config.model import Domain, RateLimitConfig
from rls.quota.actions import FAILURE_TTL_S, Answer, abandon, blanket, tokens
from rls.quota.bounds import SLICE_BUCKETS
from rls.quota.bucket import LIMITED, UNLIMITED, UNMATCHED, UNSUPPORTED, Bucket, BucketKey
from rls.quota.context import QuotaContext
from rls.quota.outbox import Outbox, Stalled
from rls.quota.pacing import demand_target
from rls.quota.pushes import PushSchedule
from rls.quota.respond import Job, Responder
from rls.quota.share import MAX_TOKENS
from rls.quota.table import BucketTable

log = logging.getLogger("rls.quota")

MAX_REPORTED = MAX_TOKENS  # requests of one bucket in one report, allowed or denied
ROOM_POLL_S = 1.0  # a stream whose client does not read retries its window pushes this often
DRAIN_FLUSH_S = 1.0  # a draining stream's last answers get this long to go out

AbortStatus = tuple[grpc.StatusCode, str]
Usage: TypeAlias = rlqs_pb2.RateLimitQuotaUsageReports.BucketQuotaUsage


class StreamEnded(Exception):
    """The stream was ended (stalled, draining) while a report was being worked through."""


class Slicer:
    """Tells a loop over buckets when it has held the event loop long enough."""

    def __init__(self, slice_ms: float) -> None:
        self.budget = slice_ms / 1000
        self.start = time.perf_counter()

    def over(self, jobs: int) -> bool:
        return jobs >= SLICE_BUCKETS or time.perf_counter() - self.start >= self.budget

    def restart(self) -> None:
        self.start = time.perf_counter()


class QuotaStream:
    """One Envoy's stream: its buckets, their ledgers, and the answers queued for it."""

    def __init__(self, ctx: QuotaContext) -> None:
        self.ctx = ctx
        self.limits = ctx.limits
        self.metrics = ctx.metrics
        self.dealer = ctx.dealer
        self.domain = ""
        self.table = BucketTable(ctx)
        self.pushes = PushSchedule()
        self.respond = Responder(ctx, self.pushes)
        self._lock = asyncio.Lock()
        self._out = Outbox(ctx.outboxes, self.limits.stream_queue_bytes, self.limits.stalled_s)
        self._wake = asyncio.Event()
        self._ended = asyncio.Event()
        self.status: AbortStatus | None = None
        self.warned_id = False
        self.warned_invalid = False  # one log line per stream for garbage, however much
        self._finishing = False  # draining: no report is answered any more

    @property
    def buckets(self) -> dict[BucketKey, Bucket]:
        return self.table.buckets

    @property
    def id_bytes(self) -> int:
        return self.table.id_bytes

    # ------------------------------------------------------------------ lifetime

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
        buckets = self.table.clear()
        self.pushes.clear()
        ctx = self.ctx
        if ctx.draining:
            for _, bucket in buckets:
                ctx.ids.forget(bucket)
            await ctx.orphans.give_back([bucket for _, bucket in buckets])
        else:
            ctx.orphans.keep(self.domain, buckets)

    # ------------------------------------------------------------------ I/O

    async def _read(self, requests: AsyncIterator[bytes]) -> None:
        try:
            async for data in requests:
                try:
                    message = rlqs_pb2.RateLimitQuotaUsageReports.FromString(data)
                except DecodeError as exc:
                    self._invalid("malformed RateLimitQuotaUsageReports ignored: %s", exc)
                    continue
                del data
                await self.handle(message)
                await self._wait_room()
        except StreamEnded:
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

    def _invalid(self, what: str, *args: object) -> None:
        """A message rls ignores: counted each time, logged once per stream (a client sending
        garbage as fast as it can would otherwise write a log line per message)."""
        self.metrics.errors.labels("invalid").inc()
        if not self.warned_invalid:
            self.warned_invalid = True
            log.info(what + " (further ones on this stream: rls_quota_errors_total"
                     "{reason=\"invalid\"} only)", *args)

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
            raise StreamEnded
        try:
            await self._out.room()
        except Stalled:
            self._end_stalled()
            raise StreamEnded from None
        if self._ended.is_set():
            raise StreamEnded

    async def _deal_sliced(
        self, jobs: list[Job], dom: Domain | None, answer: Answer, slicer: Slicer
    ) -> list[Job]:
        """The slice is over: deal its jobs, let every other caller run, respect the queue
        caps; the next slice's (empty) job list."""
        await self.respond.deal(jobs, self.domain, dom, answer)
        await asyncio.sleep(0)
        await self._wait_room()
        slicer.restart()
        return []

    # ------------------------------------------------------------------ reports

    async def handle(self, message: rlqs_pb2.RateLimitQuotaUsageReports) -> None:
        """Answer one usage report (every bucket in it) with one response (or several)."""
        self.metrics.reports.inc()
        if message.domain and self.domain and message.domain != self.domain:
            # Envoy opens one stream per domain; this stream's buckets are matched, charged
            # and left to the next stream under its first domain only.
            self._invalid("RLQS report for domain %r on a stream of domain %r ignored",
                          message.domain, self.domain)
            return
        if message.domain:
            self.domain = message.domain
        if not self.domain:
            self._invalid("RLQS report without a domain ignored")
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
        config, dom = self.ctx.snapshot(self.domain)
        jobs: list[Job] = []
        in_message: set[BucketKey] = set()
        slicer = Slicer(self.limits.slice_ms)
        for usage in message.bucket_quota_usages:
            if slicer.over(len(jobs)):
                jobs = await self._deal_sliced(jobs, dom, answer, slicer)
            job = self._take(usage, now, config, dom, answer, in_message)
            if job is not None:
                jobs.append(job)
        await self.respond.deal(jobs, self.domain, dom, answer)

    def _take(
        self, usage: Usage, now: int, config: RateLimitConfig | None, dom: Domain | None,
        answer: Answer, in_message: set[BucketKey],
    ) -> Job | None:
        """One bucket of a report: answered now, or its store job for the slice's deal."""
        opened = self._bucket(usage, dom, answer, in_message)
        if opened is None:
            return None
        bucket, new, items = opened
        self.table.seen(bucket.key, now)
        self.table.resolve(bucket, self.domain, config, dom, items)
        allowed, denied = self._reported(usage)
        self.respond.count_usage(bucket, allowed, denied)
        if bucket.kind == UNMATCHED or bucket.kind == UNSUPPORTED:
            if bucket.matched_before:
                self.respond.abandon(bucket, answer)
                self.table.forget(bucket.key)
            else:
                self.respond.unmatched(bucket, answer)
            return None
        if bucket.kind == UNLIMITED:
            self.respond.unlimited(bucket, answer)
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
        counted = dom is not None and dom.has_candidates and self.ctx.candidates is not None
        demand = allowed + denied if counted else 0
        return bucket, self.dealer.report(bucket.ledgers, allowed, bucket.target, last, demand)

    def _bucket(
        self, usage: Usage, dom: Domain | None, answer: Answer, in_message: set[BucketKey]
    ) -> tuple[Bucket, bool, dict[str, str]] | None:
        """The report's bucket (found, adopted or opened), whether it is new to this stream,
        and its entries; None when the id is refused (too big, empty, repeated, over a cap)."""
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
        bucket = self.table.buckets.get(key)
        if bucket is not None:
            return bucket, False, items
        bucket, new = self.table.open(self.domain, usage.bucket_id, key, size)
        if bucket is None:
            rule = self.respond.failure_rule(dom)
            answer.add(blanket(usage.bucket_id, rule, FAILURE_TTL_S))
            return None
        return bucket, new, items

    def _reported(self, usage: Usage) -> tuple[int, int]:
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

    # ------------------------------------------------------------------ timers

    def _deadline(self) -> float | None:
        """Local-clock ms of the next timed job: a window push, an expiry, a stall check."""
        times: list[float] = [
            t for t in (self.pushes.next_due(), self.table.next_expiry()) if t is not None
        ]
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
                self.table.evict(self.dealer.now_ms())
            await self.push_due()

    async def push_due(self) -> None:
        """Deal the new window's grant to every bucket whose window ended, in slices."""
        answer = Answer(self.send)
        try:
            async with self._lock:
                if self._finishing:
                    return
                due = self.pushes.take_due(self.dealer.now_ms(), self.table.buckets.get)
                if not due:
                    return
                _, dom = self.ctx.snapshot(self.domain)
                slicer = Slicer(self.limits.slice_ms)
                jobs: list[Job] = []
                for bucket in due:
                    if slicer.over(len(jobs)):
                        jobs = await self._deal_sliced(jobs, dom, answer, slicer)
                    jobs.append((bucket, self.dealer.push(bucket.ledgers, bucket.target)))
                await self.respond.deal(jobs, self.domain, dom, answer)
        except StreamEnded:
            return
        answer.flush()
