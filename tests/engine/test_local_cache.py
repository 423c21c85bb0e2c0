"""The local over-limit cache answers without deciding, yet every descriptor gets its status.

Like envoyproxy/ratelimit's `testBasicBaseConfig…WithLocalCache`: once a key is known over its
limit, a request carrying it is rejected without a decision round trip for that key, and the
request's other descriptors still report `current_limit`, `limit_remaining` and
`duration_until_reset` (uncharged: the request is rejected) and count in their stats.
"""

from __future__ import annotations

import pytest

from rls.config.loader import load_files
from rls.engine.limiter import OK, OVER_LIMIT, DescriptorIn, RateLimiter
from rls.observability.metrics import Metrics
from rls.settings import Settings
from rls.stores.redis import RedisBackend

CONFIG = """
domain: lc
descriptors:
  - key: tight
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: loose
    rate_limit: {unit: minute, requests_per_unit: 10}
"""

TIGHT = DescriptorIn((("tight", "t"),))
LOOSE = DescriptorIn((("loose", "l"),))


@pytest.fixture
async def limiter(redis_url: str):
    config = load_files([("lc.yaml", CONFIG)])
    backend = RedisBackend(redis_url)
    await backend.start()
    metrics = Metrics()
    yield RateLimiter(lambda: config, backend, Settings(backend_timeout_ms=2000), metrics)
    await backend.close()


def sample(limiter: RateLimiter, name: str, key: str) -> float:
    limiter.metrics.flush()
    return limiter.metrics.registry.get_sample_value(name, {"key": key}) or 0.0


async def test_other_descriptors_get_their_status_when_the_local_cache_answers(limiter) -> None:
    assert (await limiter.should_rate_limit("lc", [TIGHT])).overall == OK
    first_over = await limiter.should_rate_limit("lc", [TIGHT])  # decided: now known over
    assert first_over.overall == OVER_LIMIT
    roundtrips = limiter.metrics.registry.get_sample_value(
        "rls_backend_roundtrips_total", {"backend": "redis"}
    )

    decision = await limiter.should_rate_limit("lc", [TIGHT, LOOSE])
    assert decision.overall == OVER_LIMIT
    tight, loose = decision.statuses
    assert tight.code == OVER_LIMIT and tight.limit is not None and tight.remaining == 0
    assert loose.code == OK and loose.limit is not None
    assert loose.limit.requests_per_unit == 10
    assert loose.remaining == 10  # nothing charged: the request was rejected
    assert loose.reset_ms is not None and 0 < loose.reset_ms <= 60_000
    assert sample(limiter, "rls_limit_over_limit_with_local_cache_total", "lc.tight") == 1
    assert sample(limiter, "rls_limit_total_hits_total", "lc.loose") == 1
    assert sample(limiter, "rls_limit_within_limit_total", "lc.loose") == 1
    # One look-up for the other descriptor, nothing for the cached one.
    after = limiter.metrics.registry.get_sample_value(
        "rls_backend_roundtrips_total", {"backend": "redis"}
    )
    assert after == roundtrips + 1


async def test_a_request_of_only_cached_keys_costs_no_round_trip(limiter) -> None:
    await limiter.should_rate_limit("lc", [TIGHT])
    await limiter.should_rate_limit("lc", [TIGHT])
    before = limiter.metrics.registry.get_sample_value(
        "rls_backend_roundtrips_total", {"backend": "redis"}
    )
    decision = await limiter.should_rate_limit("lc", [TIGHT])
    assert decision.overall == OVER_LIMIT and decision.statuses[0].limit is not None
    after = limiter.metrics.registry.get_sample_value(
        "rls_backend_roundtrips_total", {"backend": "redis"}
    )
    assert after == before


async def test_local_cache_counter_uses_the_detailed_stats_key(redis_url: str) -> None:
    """With detailed_metric the reference counts every stat of the limit, the local-cache one
    included, under the request's detailed key; so does rls."""
    config = load_files([("dm.yaml", """
domain: dm
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 1}
""")])
    backend = RedisBackend(redis_url)
    await backend.start()
    try:
        lim = RateLimiter(lambda: config, backend, Settings(backend_timeout_ms=2000), Metrics())
        alice = DescriptorIn((("user", "alice"),))
        for _ in range(3):  # OK, over (decided: now known), over (from the local cache)
            await lim.should_rate_limit("dm", [alice])
        assert sample(lim, "rls_limit_over_limit_with_local_cache_total", "dm.user_alice") == 1
        assert sample(lim, "rls_limit_over_limit_total", "dm.user_alice") == 2
        assert sample(lim, "rls_limit_over_limit_with_local_cache_total", "dm.user") == 0
    finally:
        await backend.close()
