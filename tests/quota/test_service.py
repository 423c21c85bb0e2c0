"""The RLQS stream's answers per bucket kind, driven without Envoy (memory store, real protos)."""

from __future__ import annotations

import asyncio

from envoy.service.rate_limit_quota.v3 import rlqs_pb2
from prometheus_client import CollectorRegistry

from rls.config.loader import load_files
from rls.services.quota import (
    ALLOW_ALL,
    DENY_ALL,
    FAILURE_TTL_S,
    TOKENS_TTL_S,
    QuotaService,
    QuotaStream,
)
from rls.settings import Settings
from rls.stores.base import BackendError
from rls.stores.memory import MemoryBackend

CONFIG = """
domain: q
descriptors:
  - key: client
    rate_limit: {unit: second, unit_multiplier: 5, requests_per_unit: 4}
  - key: free
    rate_limit: {unlimited: true}
  - key: smooth
    rate_limit: {unit: second, requests_per_unit: 4, algorithm: token_bucket}
  - key: rolling
    rate_limit: {unit: minute, requests_per_unit: 4, window: rolling_from_first_hit}
"""


def service(backend=None, failure_mode: str = "allow", unmatched: str = "allow") -> QuotaService:
    config = load_files([("q.yaml", CONFIG)])
    settings = Settings(failure_mode=failure_mode)
    store = backend if backend is not None else MemoryBackend(sweep_interval=0)
    return QuotaService(lambda: config, store, settings, CollectorRegistry(), unmatched=unmatched)


def report(*buckets: tuple[dict[str, str], int, int], elapsed: int = 0):
    message = rlqs_pb2.RateLimitQuotaUsageReports(domain="q")
    for bucket, allowed, denied in buckets:
        usage = message.bucket_quota_usages.add()
        usage.bucket_id.bucket.update(bucket)
        usage.num_requests_allowed = allowed
        usage.num_requests_denied = denied
        usage.time_elapsed.seconds = elapsed
    return message


def answer(stream: QuotaStream, message) -> list:
    asyncio.run(stream.handle(message))
    data = stream._out.get_nowait()
    assert stream._out.empty()
    return list(rlqs_pb2.RateLimitQuotaResponse.FromString(data).bucket_action)


def test_new_limited_bucket_gets_a_blanket_rule_then_a_full_token_bucket_at_once() -> None:
    stream = QuotaStream(service())
    first, second = answer(stream, report(({"client": "a"}, 1, 0)))
    assert first.quota_assignment_action.rate_limit_strategy.blanket_rule == DENY_ALL
    tb = second.quota_assignment_action.rate_limit_strategy.token_bucket
    assert tb.max_tokens == 3  # 4 per window, 1 already admitted before the answer
    assert tb.fill_interval.seconds > TOKENS_TTL_S  # no refill while the grant lives
    assert second.quota_assignment_action.assignment_time_to_live.seconds == TOKENS_TTL_S
    assert dict(second.bucket_id.bucket) == {"client": "a"}


def test_spent_bucket_is_denied_until_the_window_resets() -> None:
    stream = QuotaStream(service())
    (action,) = answer(stream, report(({"client": "a"}, 4, 0)))
    assign = action.quota_assignment_action
    assert assign.rate_limit_strategy.blanket_rule == DENY_ALL
    assert assign.assignment_time_to_live.seconds >= TOKENS_TTL_S


def test_unlimited_bucket_gets_allow_all() -> None:
    (action,) = answer(QuotaStream(service()), report(({"free": "x"}, 1, 0)))
    assert action.quota_assignment_action.rate_limit_strategy.blanket_rule == ALLOW_ALL
    assert action.quota_assignment_action.assignment_time_to_live.seconds > 5


def test_unmatched_bucket_gets_the_configured_default() -> None:
    (allow,) = answer(QuotaStream(service()), report(({"other": "x"}, 1, 0)))
    assert allow.quota_assignment_action.rate_limit_strategy.blanket_rule == ALLOW_ALL
    (deny,) = answer(QuotaStream(service(unmatched="deny")), report(({"other": "x"}, 1, 0)))
    assert deny.quota_assignment_action.rate_limit_strategy.blanket_rule == DENY_ALL


def test_limit_with_an_algorithm_quota_mode_cannot_deal_is_unmatched_and_logged(caplog) -> None:
    svc = service()
    (action,) = answer(QuotaStream(svc), report(({"smooth": "x"}, 1, 0)))
    assert action.quota_assignment_action.rate_limit_strategy.blanket_rule == ALLOW_ALL
    assert "token_bucket" in caplog.text and "q.smooth" in caplog.text


def test_rolling_window_limit_is_unmatched_and_logged(caplog) -> None:
    """Reservations are charges: dealt, a rolling window would start at the first grant."""
    (action,) = answer(QuotaStream(service()), report(({"rolling": "x"}, 1, 0)))
    assert action.quota_assignment_action.rate_limit_strategy.blanket_rule == ALLOW_ALL
    assert "rolling_from_first_hit" in caplog.text and "q.rolling" in caplog.text


class DeadStore(MemoryBackend):
    async def decide(self, checks, now_ms=None, usage=(), usage_ttl_ms=0):
        raise BackendError("redis: connection refused")


def test_dead_store_follows_the_failure_mode_with_short_assignments() -> None:
    for mode, rule in (("allow", ALLOW_ALL), ("deny", DENY_ALL)):
        svc = service(DeadStore(sweep_interval=0), failure_mode=mode)
        (action,) = answer(QuotaStream(svc), report(({"client": "a"}, 1, 0)))
        assign = action.quota_assignment_action
        assert assign.rate_limit_strategy.blanket_rule == rule
        assert assign.assignment_time_to_live.seconds == FAILURE_TTL_S
        assert svc.metrics.errors.labels("backend")._value.get() == 1


def test_every_bucket_of_a_report_is_answered_in_one_response() -> None:
    actions = answer(QuotaStream(service()), report(
        ({"client": "a"}, 0, 0), ({"client": "b"}, 0, 0), ({"free": "x"}, 0, 0)
    ))
    assert len(actions) == 2 + 2 + 1


def test_buckets_envoy_stopped_reporting_are_forgotten() -> None:
    svc = service()
    stream = QuotaStream(svc)
    answer(stream, report(({"client": "a"}, 0, 0)))
    assert len(stream.buckets) == 1
    stream._evict(stream.dealer.now_ms() + 60_000)
    assert not stream.buckets
    assert svc.metrics.buckets._value.get() == 0


def test_thousands_of_buckets_in_one_report_are_all_answered_in_bounded_messages() -> None:
    svc = service()
    stream = QuotaStream(svc)
    asyncio.run(stream.handle(report(*(({"client": f"c{i}"}, 1, 0) for i in range(3000)))))
    messages = []
    while not stream._out.empty():
        messages.append(rlqs_pb2.RateLimitQuotaResponse.FromString(stream._out.get_nowait()))
    assert len(messages) == 3
    actions = [a for m in messages for a in m.bucket_action]
    assert len(actions) == 2 * 3000
    for m in messages:  # a bucket's blanket rule and token bucket stay in one message
        assert len(m.bucket_action) % 2 == 0
        assert all(m.bucket_action[i].bucket_id == m.bucket_action[i + 1].bucket_id
                   for i in range(0, len(m.bucket_action), 2))
    assert svc.metrics.buckets._value.get() == 3000


def test_buckets_beyond_the_per_stream_cap_get_the_failure_rule_without_state(
    monkeypatch,
) -> None:
    import rls.services.quota as quota

    monkeypatch.setattr(quota, "MAX_BUCKETS_PER_STREAM", 2)
    svc = service(failure_mode="deny")
    stream = QuotaStream(svc)
    actions = answer(stream, report(*(({"client": f"c{i}"}, 0, 0) for i in range(3))))
    assert len(stream.buckets) == 2
    (capped,) = [a for a in actions if dict(a.bucket_id.bucket) == {"client": "c2"}]
    last = capped.quota_assignment_action
    assert last.rate_limit_strategy.blanket_rule == DENY_ALL
    assert last.assignment_time_to_live.seconds == FAILURE_TTL_S
    assert svc.metrics.errors.labels("bucket_cap")._value.get() == 1
