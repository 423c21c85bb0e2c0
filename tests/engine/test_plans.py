"""Plans per request shape (rls.engine.limiter `_planned_checks`): a request the service has seen
before (its parse memo hands the same descriptors again) is decided from a plan made once; a
request seen once (a new caller, a unique key per call) is decided without making one, so
unique traffic pays nothing for plans. Planned or not, the decisions are the same."""

from __future__ import annotations

import pytest
from envoy.service.ratelimit.v3 import rls_pb2

from rls.config.loader import load_files
from rls.engine.limiter import RateLimiter
from rls.observability.metrics import Metrics
from rls.services.ratelimit import RateLimitService
from rls.settings import Settings
from rls.stores.memory import MemoryBackend

pytestmark = pytest.mark.unit

CONFIG = """
domain: d
descriptors:
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 2}
"""


class _Context:
    def time_remaining(self) -> None:
        return None

    async def abort(self, code: object, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")


def service() -> tuple[RateLimitService, RateLimiter]:
    config = load_files([("d.yaml", CONFIG)])
    settings, metrics = Settings(), Metrics()
    limiter = RateLimiter(lambda: config, MemoryBackend(sweep_interval=0), settings, metrics)
    return RateLimitService(limiter, settings, metrics), limiter


def request(ip: str) -> bytes:
    req = rls_pb2.RateLimitRequest(domain="d")
    req.descriptors.add().entries.add(key="ip", value=ip)
    return req.SerializeToString()


async def codes(svc: RateLimitService, data: bytes, n: int) -> list[int]:
    return [rls_pb2.RateLimitResponse.FromString(
        await svc.should_rate_limit(data, _Context())).overall_code for _ in range(n)]


async def test_requests_seen_once_make_no_plan() -> None:
    svc, limiter = service()
    for i in range(50):
        assert await codes(svc, request(f"10.0.0.{i}"), 1) == [rls_pb2.RateLimitResponse.OK]
    assert len(limiter._plans) == 0


async def test_a_repeated_request_is_planned_once_and_decided_as_before() -> None:
    svc, limiter = service()
    ok, over = rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT
    assert await codes(svc, request("10.1.1.1"), 4) == [ok, ok, over, over]
    assert len(limiter._plans) == 1
