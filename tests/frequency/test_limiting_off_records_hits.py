"""Issue 17 item 4: with the degradation switch `limiting_off`, hits keep being recorded
(docs/admin.md, docs/configuration.md), so switching limiting back on does not start from
zero. Pinned on the memory store and on a real redis-server."""

from __future__ import annotations

import pytest

from rls.config.loader import load_files
from rls.engine.limiter import OK, OVER_LIMIT, DescriptorIn, RateLimiter
from rls.observability.metrics import Metrics
from rls.settings import Settings
from rls.stores.memory import MemoryBackend
from rls.stores.redis import RedisBackend

CONFIG = """
domain: off
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 3}
"""
NOW = 1_700_000_000_000


@pytest.fixture(params=["memory", "redis"])
async def limiter(request):
    config = load_files([("off.yaml", CONFIG)])
    if request.param == "memory":
        backend = MemoryBackend(sweep_interval=0)
    else:
        backend = RedisBackend(request.getfixturevalue("redis_url"), timeout_ms=1000,
                               connect_timeout_ms=1000)
        await backend.start()
    settings = Settings(local_cache=False)
    yield RateLimiter(lambda: config, backend, settings, Metrics())
    await backend.close()


async def call(limiter: RateLimiter) -> int:
    desc = DescriptorIn((("k", "v"),), None, False, None)
    return (await limiter.should_rate_limit("off", [desc], 0, NOW)).overall


async def test_hits_recorded_while_limiting_off_count_after_switching_back(limiter):
    limiter.settings.limiting_off = True
    assert [await call(limiter) for _ in range(2)] == [OK, OK]
    limiter.settings.limiting_off = False
    # 2 of 3 were used while limiting was off: one call left, then over.
    assert [await call(limiter) for _ in range(2)] == [OK, OVER_LIMIT]


async def test_over_limit_calls_pass_while_off_and_limit_holds_once_back_on(limiter):
    limiter.settings.limiting_off = True
    assert [await call(limiter) for _ in range(5)] == [OK] * 5
    limiter.settings.limiting_off = False
    assert await call(limiter) == OVER_LIMIT
