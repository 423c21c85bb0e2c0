"""Turning a bucket's state into the actions Envoy enforces: grants as token buckets, store
failures as the failure mode, unmatched and unlimited buckets as blanket rules; and the
metrics of each.

Answers per bucket:
- limited: DENY_ALL then a token bucket of the grant (TTL 12 s), or DENY_ALL until the window
  resets when nothing is left; ALLOW_ALL when the domain is shadowed (rls.engine.rules);
- unlimited: ALLOW_ALL (TTL 60 s);
- unmatched (no descriptor, unknown domain, or a limit quota mode cannot deal): the default
  action, ALLOW_ALL unless RLS_QUOTA_UNMATCHED=deny; a bucket that matched before a config
  reload and no longer does gets `abandon_action` (Envoy forgets it);
- store failure: the failure mode (rls.engine.rules) for 6 s, retried at the next report.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Iterable

from rls.config.model import Domain
from rls.engine.rules import domain_shadowed, failure_mode
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
from rls.quota.bucket import LIMITED, Bucket
from rls.quota.context import QuotaContext
from rls.quota.ledger import Grant
from rls.quota.match import order_bucket
from rls.quota.pushes import PUSH_RETRY_MS, PushSchedule
from rls.stores.base import BackendError

log = logging.getLogger("rls.quota")

Job = tuple[Bucket, Awaitable[Grant]]  # a bucket and its store step


class Responder:
    """Answers of one stream; each grant dealt puts its bucket on the stream's push heap."""

    def __init__(self, ctx: QuotaContext, pushes: PushSchedule) -> None:
        self.ctx = ctx
        self.metrics = ctx.metrics
        self.pushes = pushes

    async def deal(self, jobs: list[Job], domain: str, dom: Domain | None, answer: Answer) -> None:
        """Run the buckets' store steps concurrently (pipelined on Redis), add the answers."""
        if not jobs:
            return
        results = await asyncio.gather(*(job for _, job in jobs), return_exceptions=True)
        failed: BaseException | None = None
        failures = 0
        now = self.ctx.dealer.now_ms()
        for (bucket, _), result in zip(jobs, results, strict=True):
            if isinstance(result, Grant):
                if result.candidates:
                    self._report_candidates(bucket, domain, dom, result)
                self._grant(answer, bucket, domain, result)
                self.pushes.schedule(bucket, now)
            elif isinstance(result, (BackendError, TimeoutError)):
                failed, failures = result, failures + 1
                self.metrics.errors.labels("backend").inc()
                rule = self.failure_rule(dom)
                answer.add(blanket(bucket.bucket_id, rule, FAILURE_TTL_S))
                bucket.granted = 0
                self._count_rule(rule)
                self.pushes.schedule(bucket, now + PUSH_RETRY_MS)
            elif isinstance(result, BaseException):
                raise result  # a bug: end the stream rather than answer wrongly
        if failed is not None:  # one line per slice, not per bucket
            log.warning("quota: store failed for %d bucket(s) of domain %r, failure mode for "
                        "%ss: %s", failures, domain, FAILURE_TTL_S,
                        str(failed) or type(failed).__name__)

    def _grant(self, answer: Answer, bucket: Bucket, domain: str, grant: Grant) -> None:
        bucket.granted = grant.tokens
        if domain_shadowed(self.ctx.settings, domain):
            answer.add(blanket(bucket.bucket_id, ALLOW_ALL, TOKENS_TTL_S))
            bucket.granted = 0
            self._count_rule(ALLOW_ALL)
            return
        if grant.tokens > 0:
            # A blanket rule first: Envoy then starts the token bucket full instead of carrying
            # the old bucket's fill ratio over (rls.quota.actions).
            bucket_id = bucket.bucket_id
            answer.add(blanket(bucket_id, DENY_ALL, TOKENS_TTL_S),
                       tokens(bucket_id, grant.tokens))
            self.metrics.actions["token_bucket"].inc()
        else:
            ttl = max(math.ceil(grant.reset_ms / 1000), TOKENS_TTL_S)
            answer.add(blanket(bucket.bucket_id, DENY_ALL, ttl))
            self._count_rule(DENY_ALL)

    def _report_candidates(
        self, bucket: Bucket, domain: str, dom: Domain | None, grant: Grant
    ) -> None:
        reporter = self.ctx.candidates
        if reporter is None:
            return

        def entries() -> Iterable[tuple[str, str]]:
            ordered = order_bucket(dom, dict(bucket.key)) if dom is not None else None
            return ordered or bucket.key

        for check, out in grant.candidates:
            reporter.batch(domain, entries, check, out)

    def failure_rule(self, dom: Domain | None) -> int:
        """A bucket the store could not charge: DENY_ALL in deny mode, else ALLOW_ALL (quota
        mode has no error answer per bucket: `error` allows, as Envoy's default would)."""
        return int(DENY_ALL if failure_mode(self.ctx.settings, dom) == "deny" else ALLOW_ALL)

    def unmatched(self, bucket: Bucket, answer: Answer) -> None:
        """A bucket no limit matches: the default rule (RLS_QUOTA_UNMATCHED)."""
        rule = self.ctx.unmatched_rule
        answer.add(blanket(bucket.bucket_id, rule, ALLOW_TTL_S))
        self._count_rule(rule)

    def unlimited(self, bucket: Bucket, answer: Answer) -> None:
        answer.add(blanket(bucket.bucket_id, ALLOW_ALL, ALLOW_TTL_S))
        self._count_rule(ALLOW_ALL)

    def abandon(self, bucket: Bucket, answer: Answer) -> None:
        """A bucket that matched before a reload and no longer does: Envoy forgets it."""
        answer.add(abandon(bucket.bucket_id))
        self.metrics.actions["abandon"].inc()

    def _count_rule(self, rule: int) -> None:
        self.metrics.actions["allow_all" if rule == ALLOW_ALL else "deny_all"].inc()

    def count_usage(self, bucket: Bucket, allowed: int, denied: int) -> None:
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
