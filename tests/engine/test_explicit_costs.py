"""An explicit cost (a descriptor's own hits_addend > 0) is charged whatever the decision.

Envoy sends the cost it learns after the response (`apply_on_stream_done`) in a call exactly
like a request-time one and ignores the answer. A cost refused for taking a budget past its
limit would be lost, and the budget's check-only calls (hits_addend 0) would pass forever. So,
unless the limit says `charge: on_allow`, an explicit cost lands even when it is over, as the
reference counts it; plain hits keep the all-or-nothing rule. The same holds for limits pushed
over xDS, where no rls extension can be set (Envoy Gateway's `cost.response`).
"""

from __future__ import annotations

import pytest
from config.xds.ads_server import domain, limit
from google.protobuf import any_pb2

from rls.config.loader import load_files
from rls.config.model import RateLimitConfig
from rls.config.xds.convert import build_config
from rls.engine.limiter import OK, OVER_LIMIT, DescriptorIn, RateLimiter
from rls.observability.metrics import Metrics
from rls.settings import Settings
from rls.stores.memory import MemoryBackend

pytestmark = pytest.mark.unit

NOW = 1_699_999_200_000 + 1_000  # one second into an hour

YAML = """
domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 2000}
  - key: prepaid
    rate_limit: {unit: hour, requests_per_unit: 2000, charge: on_allow}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1}
"""


def from_yaml() -> RateLimitConfig:
    return load_files([("llm.yaml", YAML)])


def from_xds() -> RateLimitConfig:
    packed = any_pb2.Any()
    packed.Pack(domain("llm", limit("tenant", "HOUR", 2000)))
    return build_config([packed])


def limiter(config: RateLimitConfig) -> RateLimiter:
    return RateLimiter(lambda: config, MemoryBackend(sweep_interval=0), Settings(), Metrics())


def tenant(key: str, hits: int | None) -> DescriptorIn:
    return DescriptorIn(((key, "acme"),), hits)


async def used(lim: RateLimiter, key: str) -> int:
    (((_, outcome),),) = await lim.query("llm", [tenant(key, 0)], now_ms=NOW)
    return int(outcome.used)


@pytest.mark.parametrize("source", ["yaml", "xds"])
async def test_a_cost_that_overflows_the_budget_lands_and_spends_it(
    source: str,
) -> None:
    lim = limiter(from_yaml() if source == "yaml" else from_xds())
    for _ in range(2):
        assert (await lim.should_rate_limit("llm", [tenant("tenant", 700)], now_ms=NOW)
                ).overall == OK
    # 1,400 used: the check-only call has room; the next cost takes the tenant to 2,100.
    assert (await lim.should_rate_limit("llm", [tenant("tenant", 0)], now_ms=NOW)).overall == OK
    third = await lim.should_rate_limit("llm", [tenant("tenant", 700)], now_ms=NOW)
    assert third.overall == OVER_LIMIT and third.statuses[0].remaining == 0
    assert await used(lim, "tenant") == 2100
    # Spent: the check-only call is refused from now on.
    check = await lim.should_rate_limit("llm", [tenant("tenant", 0)], now_ms=NOW)
    assert check.overall == OVER_LIMIT


async def test_a_check_at_exactly_full_is_refused() -> None:
    lim = limiter(from_yaml())
    assert (await lim.should_rate_limit("llm", [tenant("tenant", 2000)], now_ms=NOW)
            ).overall == OK
    check = await lim.should_rate_limit("llm", [tenant("tenant", 0)], now_ms=NOW)
    assert check.overall == OVER_LIMIT, "no room for one more: the reference would answer OK"


async def test_charge_on_allow_refuses_a_cost_that_does_not_fit_and_charges_nothing() -> None:
    lim = limiter(from_yaml())
    assert (await lim.should_rate_limit("llm", [tenant("prepaid", 1500)], now_ms=NOW)
            ).overall == OK
    refused = await lim.should_rate_limit("llm", [tenant("prepaid", 700)], now_ms=NOW)
    assert refused.overall == OVER_LIMIT
    assert await used(lim, "prepaid") == 1500
    # A smaller payload still fits.
    assert (await lim.should_rate_limit("llm", [tenant("prepaid", 500)], now_ms=NOW)
            ).overall == OK


async def test_costs_land_in_a_request_rejected_by_another_limit_plain_hits_do_not() -> None:
    lim = limiter(from_yaml())
    user = DescriptorIn((("user", "bob"),))
    assert (await lim.should_rate_limit("llm", [user], now_ms=NOW)).overall == OK
    # bob's 1/hour is spent: the request is rejected; its cost is charged all the same (the
    # reference's counting), its prepaid cost (charge: on_allow) is not.
    rejected = await lim.should_rate_limit(
        "llm", [tenant("tenant", 300), tenant("prepaid", 300), user], now_ms=NOW
    )
    assert rejected.overall == OVER_LIMIT
    assert await used(lim, "tenant") == 300
    assert await used(lim, "prepaid") == 0
    # The request-level hits_addend is a plain weight: all or nothing.
    rejected = await lim.should_rate_limit(
        "llm", [DescriptorIn((("tenant", "acme"),)), user], request_hits=300, now_ms=NOW
    )
    assert rejected.overall == OVER_LIMIT
    assert await used(lim, "tenant") == 300
