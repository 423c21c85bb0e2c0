"""Negative hits only where they mean something (issue 14 item 4): a release
(`is_negative_hits`) gives hits back only to limits that accept releases (`concurrency` by
default, any limit with `accept_releases: true`); elsewhere it is ignored and counted in
`rls_releases_ignored_total{domain}`, so one request with a huge negative addend can no longer
zero an ordinary counter."""

from __future__ import annotations

import pytest

from rls.config.errors import ConfigError
from rls.config.loader import load_files
from rls.engine.limiter import OK, OVER_LIMIT, DescriptorIn, RateLimiter
from rls.observability.metrics import Metrics
from rls.settings import Settings
from rls.stores.memory import MemoryBackend

NOW = 1_699_999_200_000 + 34_500

CONFIG = """
domain: neg
descriptors:
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: opted_in
    rate_limit: {unit: hour, requests_per_unit: 5, accept_releases: true}
  - key: inflight
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: concurrency}
  - key: inflight_no
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: concurrency,
                 accept_releases: false}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: token_bucket}
"""


def make() -> RateLimiter:
    config = load_files([("neg.yaml", CONFIG)])
    return RateLimiter(lambda: config, MemoryBackend(sweep_interval=0), Settings(), Metrics())


def d(key: str, hits: int, negative: bool = False) -> DescriptorIn:
    return DescriptorIn(((key, "x"),), hits, negative, None)


async def remaining(lim: RateLimiter, key: str) -> int:
    decision = await lim.should_rate_limit("neg", [d(key, 0)], 0, NOW)
    return decision.statuses[0].remaining


def ignored(lim: RateLimiter) -> float:
    value = lim.metrics.registry.get_sample_value("rls_releases_ignored_total",
                                                  {"domain": "neg"})
    return value or 0.0


@pytest.mark.parametrize("key", ["plain", "inflight_no", "bucket"])
async def test_huge_release_on_a_limit_that_does_not_accept_it_is_ignored(key: str) -> None:
    lim = make()
    assert (await lim.should_rate_limit("neg", [d(key, 5)], 0, NOW)).overall == OK
    assert (await lim.should_rate_limit("neg", [d(key, 1)], 0, NOW)).overall == OVER_LIMIT
    release = await lim.should_rate_limit("neg", [d(key, 4_000_000_000, True)], 0, NOW)
    assert release.overall == OK
    assert (await lim.should_rate_limit("neg", [d(key, 1)], 0, NOW)).overall == OVER_LIMIT
    assert ignored(lim) == 1


@pytest.mark.parametrize("key", ["opted_in", "inflight"])
async def test_limits_that_accept_releases_get_hits_back(key: str) -> None:
    lim = make()
    assert (await lim.should_rate_limit("neg", [d(key, 5)], 0, NOW)).overall == OK
    await lim.should_rate_limit("neg", [d(key, 2, True)], 0, NOW)
    assert await remaining(lim, key) == 2
    # a release larger than what is held floors at zero: it cannot bank credit
    await lim.should_rate_limit("neg", [d(key, 1_000_000, True)], 0, NOW)
    assert await remaining(lim, key) == 5
    assert ignored(lim) == 0


async def test_release_next_to_a_charge_in_one_request() -> None:
    """A request mixing an ignored release and a real charge charges normally."""
    lim = make()
    decision = await lim.should_rate_limit("neg", [d("plain", 2), d("plain", 9, True)], 0, NOW)
    assert decision.overall == OK
    assert await remaining(lim, "plain") == 3


def test_accept_releases_is_parsed_and_validated() -> None:
    config = load_files([("neg.yaml", CONFIG)])
    limits = {limit.full_key: limit.accept_releases for limit in config.all_limits()}
    assert limits == {"neg.plain": False, "neg.opted_in": True, "neg.inflight": True,
                      "neg.inflight_no": False, "neg.bucket": False}
    bad = CONFIG.replace("accept_releases: true", "accept_releases: maybe")
    with pytest.raises(ConfigError, match="accept_releases"):
        load_files([("neg.yaml", bad)])
