"""A burst above a shared limit, early in its window, through two Envoys on one rls (issue 33).

Two simulated Envoys (each enforcing the token buckets rls answers, reporting every 5 s on its
own stream) share one client's 20 per minute; the client sends 3x the limit within 20 s, 80 %
through one Envoy. Driven without Envoy on one deterministic clock, on the memory store and on
a real Redis (whose windows then follow that clock too).
"""

from __future__ import annotations

import math

import pytest
from envoy.service.rate_limit_quota.v3 import rlqs_pb2
from prometheus_client import CollectorRegistry

from rls.config.loader import load_files
from rls.quota.actions import DENY_ALL
from rls.quota.bounds import QuotaBounds
from rls.quota.share import Dealer
from rls.services.quota import STORE_TIMEOUT_MS, QuotaService, QuotaStream
from rls.settings import Settings
from rls.stores.base import Backend
from rls.stores.memory import MemoryBackend
from rls.stores.redis import RedisBackend

from .test_service import report
from .test_share import T0, Clock

pytestmark = [pytest.mark.slow, pytest.mark.envoy]

LIMIT = 20
CONFIG = f"""
domain: q
descriptors:
  - key: client
    rate_limit: {{unit: minute, requests_per_unit: {LIMIT}}}
"""
BUCKET = {"client": "burst"}


class Envoy:
    """One Envoy's bucket: admits what its last token bucket allows, reports every 5 s."""

    def __init__(self, svc: QuotaService) -> None:
        self.stream = QuotaStream(svc.context)
        self.tokens = 0.0
        self.allowed = self.denied = 0
        self.admitted = 0  # over the whole run

    async def report(self, elapsed: int) -> None:
        message = report((BUCKET, self.allowed, self.denied), elapsed=elapsed)
        self.allowed = self.denied = 0
        await self.stream.handle(message)
        self.take_answers()

    async def push(self) -> None:
        """The stream's window push, as its timer would run it just after the window's end."""
        await self.stream.push_due()
        self.take_answers()

    def take_answers(self) -> None:
        while self.stream._out:
            data = self.stream._out.popleft()
            for action in rlqs_pb2.RateLimitQuotaResponse.FromString(data).bucket_action:
                strategy = action.quota_assignment_action.rate_limit_strategy
                if strategy.HasField("token_bucket"):
                    self.tokens = strategy.token_bucket.max_tokens
                else:
                    self.tokens = 0 if strategy.blanket_rule == DENY_ALL else math.inf

    def offer(self, requests: int) -> None:
        admit = int(min(requests, self.tokens))
        self.tokens -= admit
        self.allowed += admit
        self.denied += requests - admit
        self.admitted += admit


async def burst_admitted(store: Backend, clock: Clock) -> int:
    """What the burst gets in its window: 60 requests over its first 20 s, 48 / 12 through the
    two Envoys, after a quiet window in which both reported a little use (so rls knows the
    counter is shared and every Envoy's demand)."""
    config = load_files([("q.yaml", CONFIG)])
    svc = QuotaService(lambda: config, store, Settings(), CollectorRegistry(),
                       dealer=Dealer(store, STORE_TIMEOUT_MS, clock), limits=QuotaBounds())
    busy, quiet = Envoy(svc), Envoy(svc)
    clock.now = T0 + 0.9
    for envoy in (busy, quiet):
        await envoy.report(elapsed=0)  # a bucket new to Envoy: reported at once
        envoy.offer(1)
    for _ in range(12):  # the quiet window's reports, every 5 s, the last 0.1 s before its end
        clock.now += 5
        for envoy in (busy, quiet):
            await envoy.report(elapsed=5)
    clock.now = T0 + 60.05  # the window's end: rls pushes the new window's grants
    for envoy in (busy, quiet):
        await envoy.push()
    before = busy.admitted + quiet.admitted
    for period in range(12):  # the burst's 4 periods of 5 s, then reports until the window ends
        if period < 4:
            busy.offer(12)
            quiet.offer(3)
        clock.now = T0 + 60 + 5 * (period + 1) - 0.1
        for envoy in (busy, quiet):
            await envoy.report(elapsed=5)
    return busy.admitted + quiet.admitted - before


async def test_a_burst_over_a_shared_limit_gets_nearly_all_of_it_within_its_window() -> None:
    clock = Clock()
    admitted = await burst_admitted(MemoryBackend(clock=clock, sweep_interval=0), clock)
    assert LIMIT >= admitted >= 0.95 * LIMIT, admitted


async def test_the_same_burst_on_redis(redis_url: str) -> None:
    clock = Clock()
    store = RedisBackend(redis_url, timeout_ms=2000, connect_timeout_ms=2000)
    await store.start()
    try:
        store.clock.now_ms = lambda: int(clock() * 1000)  # type: ignore[method-assign]
        admitted = await burst_admitted(store, clock)
    finally:
        await store.close()
    assert LIMIT >= admitted >= 0.95 * LIMIT, admitted
