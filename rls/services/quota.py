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
- store failure: the failure mode (allow / deny) for 6 s, retried at the next report.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.service.rate_limit_quota.v3 import rlqs_pb2
from envoy.type.v3 import ratelimit_strategy_pb2
from google.protobuf.message import DecodeError
from prometheus_client import CollectorRegistry

from rls.config.model import Domain, RateLimitConfig
from rls.engine.checks import match_targets
from rls.quota.match import order_bucket
from rls.quota.metrics import QuotaMetrics
from rls.quota.share import (
    REPORT_CADENCE_S,
    Dealer,
    Grant,
    Ledger,
    demand_target,
    initial_target,
    undealable,
)
from rls.settings import Settings
from rls.stores.base import Backend, BackendError

log = logging.getLogger("rls.quota")

SERVICE_NAME = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"
METHOD_NAME = "StreamRateLimitQuotas"

# Whole seconds (Envoy truncates), each longer than the 5 s report cadence.
TOKENS_TTL_S = 12  # a grant outlives one lost report
ALLOW_TTL_S = 60  # unlimited / unmatched: nothing to re-deal
FAILURE_TTL_S = 6  # store down: until just after the next report, which retries
PUSH_DELAY_MS = 30  # after a window's end, so the store's clock is surely in the new window
FORGET_AFTER_MS = int(3 * REPORT_CADENCE_S * 1000)  # Envoy lists every bucket it holds
MAX_BUCKETS_PER_STREAM = 20_000
RESPONSE_ACTIONS = 2_000  # per response message (~150 KB), whatever the report's size
STORE_TIMEOUT_MS = 250  # off the request path: a report may wait longer than a decision

ALLOW_ALL = ratelimit_strategy_pb2.RateLimitStrategy.ALLOW_ALL
DENY_ALL = ratelimit_strategy_pb2.RateLimitStrategy.DENY_ALL

LIMITED, UNLIMITED, UNMATCHED, UNSUPPORTED = "limited", "unlimited", "unmatched", "unsupported"

BucketKey = tuple[tuple[str, str], ...]


@dataclass(slots=True)
class Bucket:
    bucket_id: rlqs_pb2.BucketId
    kind: str = UNMATCHED
    ledgers: list[Ledger] = field(default_factory=list)
    config: object = None  # the config snapshot `kind` and `ledgers` come from
    matched_before: bool = False
    last_report_ms: int = 0
    target: int = 1


def _blanket(bucket_id: rlqs_pb2.BucketId, rule: int, ttl_s: int) -> rlqs_pb2.RateLimitQuotaResponse.BucketAction:  # noqa: E501
    action = rlqs_pb2.RateLimitQuotaResponse.BucketAction(bucket_id=bucket_id)
    assign = action.quota_assignment_action
    assign.assignment_time_to_live.seconds = ttl_s
    assign.rate_limit_strategy.blanket_rule = rule
    return action


def _tokens(bucket_id: rlqs_pb2.BucketId, tokens: int) -> rlqs_pb2.RateLimitQuotaResponse.BucketAction:  # noqa: E501
    action = rlqs_pb2.RateLimitQuotaResponse.BucketAction(bucket_id=bucket_id)
    assign = action.quota_assignment_action
    assign.assignment_time_to_live.seconds = TOKENS_TTL_S
    bucket = assign.rate_limit_strategy.token_bucket
    bucket.max_tokens = tokens
    bucket.tokens_per_fill.value = 1
    # No refill while the assignment lives: the grant is all this stream may use.
    bucket.fill_interval.seconds = TOKENS_TTL_S + 1
    return action


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
    ) -> None:
        self._config = config
        self.settings = settings
        self.metrics = QuotaMetrics(registry)
        self.dealer = dealer or Dealer(backend, max(settings.backend_timeout_ms, STORE_TIMEOUT_MS))
        mode = unmatched or os.environ.get("RLS_QUOTA_UNMATCHED", "allow")
        if mode not in ("allow", "deny"):
            raise ValueError(f"RLS_QUOTA_UNMATCHED must be allow or deny, not {mode!r}")
        self.unmatched_rule = ALLOW_ALL if mode == "allow" else DENY_ALL
        self._warned: set[str] = set()

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME, {METHOD_NAME: grpc.stream_stream_rpc_method_handler(self.stream)}
        )

    async def stream(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        session = QuotaStream(self)
        self.metrics.streams.inc()
        try:
            async for out in session.run(requests):
                yield out
        finally:
            self.metrics.streams.dec()
            self.metrics.buckets.dec(len(session.buckets))
            session.buckets.clear()

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
        self.metrics = service.metrics
        self.dealer = service.dealer
        self.domain = ""
        self.buckets: dict[BucketKey, Bucket] = {}
        self._seen: dict[BucketKey, int] = {}
        self._lock = asyncio.Lock()
        self._out: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._wake = asyncio.Event()

    async def run(self, requests: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        reader = asyncio.get_running_loop().create_task(self._read(requests))
        pusher = asyncio.get_running_loop().create_task(self._push_forever())
        try:
            while True:
                out = await self._out.get()
                if out is None:
                    break
                yield out
        finally:
            for task in (reader, pusher):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _read(self, requests: AsyncIterator[bytes]) -> None:
        try:
            async for data in requests:
                try:
                    message = rlqs_pb2.RateLimitQuotaUsageReports.FromString(data)
                except DecodeError as exc:
                    self.metrics.errors.labels("invalid").inc()
                    log.info("malformed RateLimitQuotaUsageReports ignored: %s", exc)
                    continue
                await self.handle(message)
        except Exception:
            log.exception("quota stream (domain %r) failed; Envoy will reconnect", self.domain)
            raise
        finally:
            self._out.put_nowait(None)

    # ------------------------------------------------------------------ reports

    async def handle(self, message: rlqs_pb2.RateLimitQuotaUsageReports) -> None:
        """Answer one usage report (every bucket in it) with one response."""
        self.metrics.reports.inc()
        if message.domain:
            self.domain = message.domain
        if not self.domain:
            self.metrics.errors.labels("invalid").inc()
            log.info("RLQS report without a domain ignored")
            return
        async with self._lock:
            response = await self._answer(message)
        if response.bucket_action:
            self._send(response)
        self._wake.set()

    async def _answer(
        self, message: rlqs_pb2.RateLimitQuotaUsageReports
    ) -> rlqs_pb2.RateLimitQuotaResponse:
        now = self.dealer.now_ms()
        config = self.service._config()
        dom = config.domains.get(self.domain) if config is not None else None
        response = rlqs_pb2.RateLimitQuotaResponse()
        jobs = []
        in_message: set[BucketKey] = set()
        for usage in message.bucket_quota_usages:
            items = dict(usage.bucket_id.bucket)
            if not items:
                self.metrics.errors.labels("invalid").inc()
                continue
            key: BucketKey = tuple(sorted(items.items()))
            if key in in_message:  # Envoy lists a bucket once; a repeat would race itself
                self.metrics.errors.labels("invalid").inc()
                continue
            in_message.add(key)
            bucket = self.buckets.get(key)
            new = bucket is None
            if bucket is None:
                if len(self.buckets) >= MAX_BUCKETS_PER_STREAM:
                    self.metrics.errors.labels("bucket_cap").inc()
                    response.bucket_action.append(
                        _blanket(usage.bucket_id, self._failure_rule(dom), FAILURE_TTL_S)
                    )
                    continue
                bucket = Bucket(rlqs_pb2.BucketId())
                bucket.bucket_id.CopyFrom(usage.bucket_id)
                self.buckets[key] = bucket
                self.metrics.buckets.inc()
            self._seen[key] = now
            self._resolve(bucket, config, dom, items)
            allowed, denied = usage.num_requests_allowed, usage.num_requests_denied
            self._count_usage(bucket, allowed, denied)
            if bucket.kind == UNMATCHED or bucket.kind == UNSUPPORTED:
                if bucket.matched_before:
                    action = rlqs_pb2.RateLimitQuotaResponse.BucketAction(
                        bucket_id=bucket.bucket_id
                    )
                    action.abandon_action.SetInParent()
                    response.bucket_action.append(action)
                    self.metrics.assignments.labels("abandon").inc()
                    self._forget(key)
                else:
                    response.bucket_action.append(
                        _blanket(bucket.bucket_id, self.service.unmatched_rule, ALLOW_TTL_S)
                    )
                    self._count_rule(self.service.unmatched_rule)
                continue
            if bucket.kind == UNLIMITED:
                response.bucket_action.append(_blanket(bucket.bucket_id, ALLOW_ALL, ALLOW_TTL_S))
                self._count_rule(ALLOW_ALL)
                continue
            elapsed = usage.time_elapsed.seconds + usage.time_elapsed.nanos / 1e9
            resumed = new and elapsed > 0
            target: int | None
            if new and not resumed:
                bucket.target, target = initial_target(bucket.ledgers), None
            else:
                span = elapsed if new else (now - bucket.last_report_ms) / 1000
                bucket.target = target = demand_target(allowed + denied, span)
            last = bucket.last_report_ms
            bucket.last_report_ms = now
            jobs.append((bucket, self.dealer.report(
                bucket.ledgers, allowed, target, last, resumed
            )))
        await self._deal(jobs, dom, response)
        self._evict(now)
        return response

    async def _deal(self, jobs: list[Any], dom: Domain | None, response: rlqs_pb2.RateLimitQuotaResponse) -> None:  # noqa: E501
        """Run the buckets' store steps concurrently (pipelined on Redis), append answers."""
        if not jobs:
            return
        results = await asyncio.gather(*(job for _, job in jobs), return_exceptions=True)
        failed: BaseException | None = None
        failures = 0
        for (bucket, _), result in zip(jobs, results, strict=True):
            if isinstance(result, Grant):
                self._append_grant(response, bucket, result)
            elif isinstance(result, (BackendError, TimeoutError)):
                failed, failures = result, failures + 1
                self.metrics.errors.labels("backend").inc()
                rule = self._failure_rule(dom)
                response.bucket_action.append(_blanket(bucket.bucket_id, rule, FAILURE_TTL_S))
                self._count_rule(rule)
            else:
                raise result  # a bug: let grpc report it rather than answer wrongly
        if failed is not None:  # one line per report, not per bucket
            log.warning("quota: store failed for %d bucket(s) of domain %r, failure mode for "
                        "%ss: %s", failures, self.domain, FAILURE_TTL_S,
                        str(failed) or type(failed).__name__)

    def _append_grant(
        self, response: rlqs_pb2.RateLimitQuotaResponse, bucket: Bucket, grant: Grant
    ) -> None:
        settings = self.service.settings
        if settings.limiting_off or settings.shadow_mode or self.domain in settings.shadow_domains:
            response.bucket_action.append(_blanket(bucket.bucket_id, ALLOW_ALL, TOKENS_TTL_S))
            self._count_rule(ALLOW_ALL)
            return
        if grant.tokens > 0:
            # A blanket rule first: Envoy then starts the token bucket full instead of carrying
            # the old bucket's fill ratio over (reference/rlqs.md).
            response.bucket_action.append(_blanket(bucket.bucket_id, DENY_ALL, TOKENS_TTL_S))
            response.bucket_action.append(_tokens(bucket.bucket_id, grant.tokens))
            self.metrics.assignments.labels("token_bucket").inc()
        else:
            ttl = max(math.ceil(grant.reset_ms / 1000), TOKENS_TTL_S)
            response.bucket_action.append(_blanket(bucket.bucket_id, DENY_ALL, ttl))
            self._count_rule(DENY_ALL)

    def _failure_rule(self, dom: Domain | None) -> int:
        mode = (dom.failure_mode if dom is not None else None) or self.service.settings.failure_mode
        return int(ALLOW_ALL if mode == "allow" else DENY_ALL)

    def _count_rule(self, rule: int) -> None:
        self.metrics.assignments.labels("allow_all" if rule == ALLOW_ALL else "deny_all").inc()

    def _count_usage(self, bucket: Bucket, allowed: int, denied: int) -> None:
        if not allowed and not denied:
            return
        names = [ledger.limit.full_key for ledger in bucket.ledgers] or [f"_{bucket.kind}"]
        if bucket.kind != LIMITED:
            names = [f"_{bucket.kind}"]
        for name in names:
            if allowed:
                self.metrics.usage.labels(name, "allowed").inc(allowed)
            if denied:
                self.metrics.usage.labels(name, "denied").inc(denied)

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
        entries = order_bucket(dom, items) if dom is not None else None
        if entries is None or dom is None:
            bucket.kind, bucket.ledgers = UNMATCHED, []
            return
        prefix = self.service.settings.key_prefix
        targets = match_targets(dom, self.domain, entries, prefix)
        replaced = {name for limit, *_ in targets for name in limit.replaces}
        old = {ledger.key: ledger for ledger in bucket.ledgers}
        ledgers = []
        for limit, key, dyn, _ in targets:
            if limit.unlimited or (limit.name and limit.name in replaced):
                continue
            why = undealable(limit)
            if why is not None:
                self.service.warn_unsupported(limit.full_key, why)
                bucket.kind, bucket.ledgers = UNSUPPORTED, []
                return
            ledgers.append(old.get(key) or Ledger(limit, key, dyn))
        for ledger in ledgers:
            ledger.limit = next(t[0] for t in targets if t[1] == ledger.key)
        bucket.kind = LIMITED if ledgers else UNLIMITED
        bucket.ledgers = ledgers

    def _forget(self, key: BucketKey) -> None:
        if self.buckets.pop(key, None) is not None:
            self.metrics.buckets.dec()
        self._seen.pop(key, None)

    def _evict(self, now: int) -> None:
        """Drop buckets Envoy stopped reporting (it lists all it holds every 5 s)."""
        stale = [k for k, seen in self._seen.items() if now - seen > FORGET_AFTER_MS]
        for key in stale:
            self._forget(key)

    def _send(self, response: rlqs_pb2.RateLimitQuotaResponse) -> None:
        """Queue the answer, in messages of at most ~RESPONSE_ACTIONS actions, never
        splitting one bucket's actions (a blanket rule and its token bucket go together)."""
        actions = response.bucket_action
        if len(actions) <= RESPONSE_ACTIONS:
            self._out.put_nowait(response.SerializeToString())
            return
        chunk = rlqs_pb2.RateLimitQuotaResponse()
        for i, action in enumerate(actions):
            if (
                len(chunk.bucket_action) >= RESPONSE_ACTIONS
                and action.bucket_id != actions[i - 1].bucket_id
            ):
                self._out.put_nowait(chunk.SerializeToString())
                chunk = rlqs_pb2.RateLimitQuotaResponse()
            chunk.bucket_action.append(action)
        self._out.put_nowait(chunk.SerializeToString())

    # ------------------------------------------------------------------ window pushes

    def _next_due(self) -> int | None:
        ends = [
            ledger.end_ms
            for bucket in self.buckets.values()
            if bucket.kind == LIMITED
            for ledger in bucket.ledgers
            if ledger.end_ms and not ledger.shadow
        ]
        return min(ends) + PUSH_DELAY_MS if ends else None

    async def _push_forever(self) -> None:
        """At each window end of a limit, deal the new window's grants without a report."""
        while True:
            self._wake.clear()
            due = self._next_due()
            timeout = None if due is None else max(0.0, (due - self.dealer.now_ms()) / 1000)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
                    continue
            await self.push_due()
            due = self._next_due()
            if due is not None and due <= self.dealer.now_ms():
                await asyncio.sleep(1.0)  # the store failed the push: retry, not spin

    async def push_due(self) -> None:
        async with self._lock:
            now = self.dealer.now_ms()
            due = [
                bucket for bucket in self.buckets.values()
                if bucket.kind == LIMITED
                and any(ledger.end_ms and now >= ledger.end_ms for ledger in bucket.ledgers)
            ]
            if not due:
                return
            config = self.service._config()
            dom = config.domains.get(self.domain) if config is not None else None
            response = rlqs_pb2.RateLimitQuotaResponse()
            jobs = [(bucket, self.dealer.push(bucket.ledgers, bucket.target)) for bucket in due]
            await self._deal(jobs, dom, response)
        if response.bucket_action:
            self._send(response)
