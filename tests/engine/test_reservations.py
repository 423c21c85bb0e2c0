"""`reserve:` in decisions (rls/engine/reservations.py, docs/token-budgets.md).

A request's estimate is charged all-or-nothing at request time, so concurrent requests cannot
together pass the budget; its stream-end settle charges actual - estimate, or releases the
difference; a repeated settle changes nothing; a settle without a reservation charges the
actual cost as a plain explicit cost; an unsettled reservation expires with its estimate kept.
The request-id and settle entries are never part of the counter key.
"""

from __future__ import annotations

import pytest

from rls.config.loader import load_files
from rls.core.model import Check, Outcome
from rls.engine.decision import Status
from rls.engine.limiter import OK, OVER_LIMIT, DescriptorIn, RateLimiter
from rls.engine.over_limit_cache import OverLimitCache
from rls.observability.metrics import Metrics
from rls.settings import Settings
from rls.stores.memory import MemoryBackend

pytestmark = pytest.mark.unit

NOW = 1_699_999_200_000 + 1_000  # one second into an hour

YAML = """
domain: llm
descriptors:
  - key: tenant
    rate_limit:
      unit: hour
      requests_per_unit: 2000
      reserve: {estimate: 800, id_key: request_id, settle_key: settle, expire_after: 60s}
  - key: model
    rate_limit:
      unit: hour
      requests_per_unit: 2000
      reserve: {id_key: request_id, settle_key: settle, expire_after: 60s}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 2000}
"""


def make() -> tuple[RateLimiter, Metrics]:
    config = load_files([("llm.yaml", YAML)])
    metrics = Metrics()
    lim = RateLimiter(lambda: config, MemoryBackend(sweep_interval=0), Settings(), metrics)
    return lim, metrics


def reserve(rid: str, hits: int | None = 0, key: str = "tenant") -> DescriptorIn:
    return DescriptorIn(((key, "acme"), ("request_id", rid)), hits)


def settle(rid: str, actual: int, key: str = "tenant") -> DescriptorIn:
    return DescriptorIn(((key, "acme"), ("request_id", rid), ("settle", "1")), actual)


async def used(lim: RateLimiter, key: str = "tenant", now: int = NOW) -> int:
    (((_, outcome),),) = await lim.query("llm", [DescriptorIn(((key, "acme"),), 0)], now_ms=now)
    return int(outcome.used)


async def decide(lim: RateLimiter, desc: DescriptorIn, now: int = NOW) -> int:
    return (await lim.should_rate_limit("llm", [desc], now_ms=now)).overall


def value(metrics: Metrics, name: str) -> float:
    got = metrics.registry.get_sample_value(name)
    return 0.0 if got is None else got


async def test_reservations_admit_only_what_the_estimates_fit() -> None:
    lim, _ = make()
    # 2000 / 800: two reservations fit; the third is refused and charges nothing.
    assert await decide(lim, reserve("a")) == OK
    assert await decide(lim, reserve("b")) == OK
    assert await decide(lim, reserve("c")) == OVER_LIMIT
    assert await used(lim) == 1600


async def test_settle_charges_the_difference_or_releases_it() -> None:
    lim, metrics = make()
    await decide(lim, reserve("a"))
    await decide(lim, reserve("b"))
    await decide(lim, settle("a", 300))  # 500 given back
    assert await used(lim) == 1100
    await decide(lim, settle("b", 1000))  # 200 more, charged although it passes nothing
    assert await used(lim) == 1300
    assert value(metrics, "rls_reservations_settled_total") == 2
    assert value(metrics, "rls_reservations_open") == 0


async def test_a_difference_past_the_budget_lands() -> None:
    lim, _ = make()
    await decide(lim, reserve("a"))
    await decide(lim, reserve("b"))
    await decide(lim, settle("a", 1500))  # 700 more: 2300 of 2000, the tokens were used
    assert await used(lim) == 2300
    assert await decide(lim, reserve("c")) == OVER_LIMIT


async def test_a_repeated_settle_changes_nothing() -> None:
    lim, _ = make()
    await decide(lim, reserve("a"))
    await decide(lim, settle("a", 300))
    await decide(lim, settle("a", 300))
    await decide(lim, settle("a", 1200))
    assert await used(lim) == 300


async def test_a_settle_without_reservation_charges_the_actual_once() -> None:
    lim, metrics = make()
    await decide(lim, settle("ghost", 700))
    await decide(lim, settle("ghost", 700))  # a repeat of it: a no-op too
    assert await used(lim) == 700
    assert value(metrics, "rls_settles_without_reservation_total") == 1


async def test_the_estimate_is_the_request_time_hits_addend_when_not_fixed() -> None:
    lim, _ = make()
    assert await decide(lim, reserve("a", 1500, key="model")) == OK
    assert await used(lim, "model") == 1500
    assert await decide(lim, reserve("b", 600, key="model")) == OVER_LIMIT
    await decide(lim, settle("a", 400, key="model"))
    assert await used(lim, "model") == 400


async def test_request_id_and_settle_entries_are_not_in_the_counter_key() -> None:
    lim, _ = make()
    await decide(lim, reserve("a"))
    await decide(lim, reserve("b"))
    # The tenant's one counter holds both; the plain query (no id) reads it.
    assert await used(lim) == 1600


async def test_an_unsettled_reservation_expires_keeping_its_estimate() -> None:
    lim, metrics = make()
    await decide(lim, reserve("a"))
    assert value(metrics, "rls_reservations_open") == 1
    await lim.reservations.store.sweep(NOW + 61_000)
    assert value(metrics, "rls_reservations_open") == 0
    assert value(metrics, "rls_reservations_expired_total") == 1
    assert await used(lim) == 800
    # Its late settle finds nothing: charged as a plain cost on top (over-counts, never under).
    await decide(lim, settle("a", 300), NOW + 62_000)
    assert await used(lim, now=NOW + 62_000) == 1100


async def test_a_refused_reservation_is_not_recorded() -> None:
    lim, metrics = make()
    await decide(lim, reserve("a"))
    await decide(lim, reserve("b"))
    await decide(lim, reserve("c"))  # refused
    assert value(metrics, "rls_reservations_open") == 2
    await decide(lim, settle("c", 100))  # a refused request's settle (none: Envoy sends none)
    assert await used(lim) == 1700


async def test_a_release_never_crosses_into_a_new_window() -> None:
    lim, metrics = make()
    before = NOW + 3_590_000  # 10 s before the hour ends
    await decide(lim, reserve("a"), before)
    later = before + 20_000  # the next hour, within the reservation's expiry
    await decide(lim, settle("a", 100), later)
    assert value(metrics, "rls_reservations_settled_total") == 1
    assert await used(lim, now=later) == 0  # nothing released from the new window's counter
    assert await used(lim, now=before) == 800


async def test_descriptors_without_reserve_entries_decide_as_ever() -> None:
    lim, _ = make()
    for _ in range(2):
        assert await decide(lim, DescriptorIn((("plain", "acme"),), 1000)) == OK
    assert await decide(lim, DescriptorIn((("plain", "acme"),), 0)) == OVER_LIMIT


def test_the_local_over_limit_cache_never_holds_a_reserve_limit() -> None:
    """A settle on any replica gives room back: a key refused by a reservation must be asked
    again, not answered over limit from one replica's memory until its window resets."""
    config = load_files([("llm.yaml", YAML)])
    (tenant_limit,) = config.domains["llm"].root.ordered[0].limits
    (plain_limit,) = config.domains["llm"].root.ordered[2].limits
    cache = OverLimitCache(Metrics())
    checks = [Check(0, tenant_limit, "rl:t", 800), Check(0, plain_limit, "rl:p", 800)]
    refused = Outcome(ok=False, charged=False, remaining=0, reset_ms=60_000, used=1600)
    cache.remember(checks, [refused, refused])
    assert cache.answer([checks[0]], [Status()]) is None
    assert cache.answer([checks[1]], [Status()]) is checks[1]


SHADOWED = """
domain: llm
descriptors:
  - key: tenant
    shadow_mode: true
    rate_limit:
      unit: hour
      requests_per_unit: 1000
      reserve: {estimate: 800, id_key: request_id, settle_key: settle}
"""


async def test_shadow_mode_reserves_and_settles_without_refusing() -> None:
    config = load_files([("llm.yaml", SHADOWED)])
    lim = RateLimiter(lambda: config, MemoryBackend(sweep_interval=0), Settings(), Metrics())
    assert await decide(lim, reserve("a")) == OK
    assert await decide(lim, reserve("b")) == OK  # over the limit, let through by shadow mode
    assert await used(lim) == 1600
    await decide(lim, settle("a", 300))
    await decide(lim, settle("b", 300))
    assert await used(lim) == 600


CANDIDATES = """
domain: llm
descriptors:
  - key: tenant
    rate_limit:
      unit: hour
      requests_per_unit: 1000
      reserve: {id_key: request_id, settle_key: settle}
      candidates: [{name: tight, requests_per_unit: 500}]
"""


@pytest.mark.parametrize(("estimate", "candidate_used"), [(400, 300), (800, 0)])
async def test_candidates_follow_the_live_reservation(estimate: int, candidate_used: int) -> None:
    """A candidate is charged the estimate when it would admit it and settled like the live
    limit; one that would have refused it holds nothing, and the release stops at zero."""
    config = load_files([("llm.yaml", CANDIDATES)])
    backend = MemoryBackend(sweep_interval=0)
    lim = RateLimiter(lambda: config, backend, Settings(), Metrics())
    assert await decide(lim, reserve("a", estimate)) == OK
    await decide(lim, settle("a", 300))
    assert await used(lim) == 300
    (live,) = config.domains["llm"].root.ordered[0].limits
    (cand,) = live.candidates
    (live_check,) = [k for k in backend._data if not k.endswith(cand.ident)]
    (outcome,) = backend.decide_now(
        [Check(0, cand, live_check + cand.ident, 0)], NOW, charge=False
    ).outcomes
    assert outcome.used == candidate_used
