"""Candidate limits on RLQS streams (quota mode), on the memory store and a real Redis.

Envoy reports per bucket how many requests it allowed and denied since its last report; each
report charges the bucket's candidate limits with all of them (the demand), in the same store
call that settles the live reservation. A candidate then reports, of those requests, the ones
past its room as would-be over-limit and the ones past its near-limit ratio as near. Checked
report by report against a reference model of fixed windows, and for the answers Envoy gets:
the same with candidates as without.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry

from rls.config.loader import load_files
from rls.config.model import limits_of
from rls.core.model import Check
from rls.engine.candidates import CandidateReporter
from rls.engine.top import TopTalkers, merge_candidates
from rls.observability.metrics import Metrics
from rls.quota.ledger import Ledger
from rls.quota.share import Dealer
from rls.services.quota import QuotaService, QuotaStream
from rls.settings import Settings
from rls.stores.base import Backend
from rls.stores.memory import MemoryBackend

from .test_service import actions, answer, report
from .test_share import Clock

LIMIT, HALVE = 40, 20
CONFIG = f"""
domain: q
descriptors:
  - key: client
    rate_limit: {{unit: hour, requests_per_unit: {LIMIT}}}
    candidates:
      - {{name: same, requests_per_unit: {LIMIT}}}
      - {{name: halve, requests_per_unit: {HALVE}}}
"""
NEAR_RATIO = 0.8


def quota(
    yaml: str, store: Backend, clock: Clock | None = None, counted: bool = True
) -> tuple[QuotaStream, Metrics, TopTalkers]:
    """A stream of a quota service on `store`, its candidate verdicts going to fresh metrics
    and top talkers (none with `counted` False)."""
    config = load_files([("q.yaml", yaml)])
    metrics, top = Metrics(CollectorRegistry()), TopTalkers()
    reporter = CandidateReporter(metrics, top, NEAR_RATIO) if counted else None
    dealer = Dealer(store, 10_000, clock) if clock is not None else None
    service = QuotaService(lambda: config, store, Settings(), CollectorRegistry(),
                           dealer=dealer, candidates=reporter)
    return QuotaStream(service.context), metrics, top


def counts(metrics: Metrics, candidate: str) -> tuple[float, float, float]:
    """(checks, over, near) of candidate `candidate` of limit q.client."""
    metrics.flush()
    labels = {"domain": "q", "limit": "q.client", "candidate": candidate}
    return tuple(  # type: ignore[return-value]
        metrics.registry.get_sample_value(f"rls_candidate_{name}_total", labels) or 0.0
        for name in ("checks", "over_limit", "near_limit")
    )


def model(used: int, demand: int, limit: int) -> tuple[int, int]:
    """(over, near) of `demand` requests on a fixed window already holding `used`: request
    number j (used < j <= used + demand) is over past `limit`, near past 80 % of it."""
    over = sum(1 for j in range(used + 1, used + demand + 1) if j > limit)
    near = sum(1 for j in range(used + 1, used + demand + 1)
               if int(limit * NEAR_RATIO) < j <= limit)
    return over, near


async def test_candidates_report_the_requests_past_their_room_report_by_report(
    memory_or_redis: Backend,
) -> None:
    stream, metrics, _ = quota(CONFIG, memory_or_redis)
    rng = random.Random(5)
    used: Counter[tuple[str, str]] = Counter()
    expected = {name: [0, 0, 0] for name in ("same", "halve")}
    for _ in range(30):
        client = rng.choice("ab")
        allowed, denied = rng.randint(0, 6), rng.randint(0, 3)
        await actions(stream, report(({"client": client}, allowed, denied), elapsed=5))
        demand = allowed + denied
        for name, limit in (("same", LIMIT), ("halve", HALVE)):
            over, near = model(used[client, name], demand, limit)
            used[client, name] += demand
            expected[name][0] += demand
            expected[name][1] += over
            expected[name][2] += near
            assert counts(metrics, name) == tuple(expected[name]), (client, allowed, denied)
    assert expected["halve"][1] > 0 and expected["same"][1] > 0  # both went over
    assert expected["halve"][1] > expected["same"][1]


async def test_candidates_never_change_what_envoy_is_told() -> None:
    """The same reports on a config with and without candidates: the same answers (two
    memory stores on one clock)."""
    plain = "\n".join(line for line in CONFIG.splitlines()
                      if "candidates" not in line and "{name:" not in line)
    clock = Clock()
    with_candidates, _, _ = quota(CONFIG, MemoryBackend(clock=clock, sweep_interval=0), clock)
    without, _, _ = quota(plain, MemoryBackend(clock=clock, sweep_interval=0), clock)
    rng = random.Random(9)
    for _ in range(25):
        clock.now += rng.choice((1, 5, 60))
        message = report(({"client": rng.choice("ab")}, rng.randint(0, 9), rng.randint(0, 4)),
                         elapsed=5)
        a = await actions(with_candidates, message)
        b = await actions(without, message)
        assert [x.SerializeToString() for x in a] == [x.SerializeToString() for x in b]


def test_a_new_window_starts_each_candidate_afresh() -> None:
    clock = Clock()
    store = MemoryBackend(clock=clock, sweep_interval=0)
    five_s = CONFIG.replace("unit: hour", "unit: second, unit_multiplier: 5")
    stream, metrics, _ = quota(five_s, store, clock)
    answer(stream, report(({"client": "a"}, 15, 15), elapsed=5))
    assert counts(metrics, "halve") == (30, 10, 4)  # 21..30 over, 17..20 near (80 % of 20)
    clock.now += 5
    answer(stream, report(({"client": "a"}, 18, 0), elapsed=5))
    assert counts(metrics, "halve") == (48, 10, 6)  # a fresh window: 17 and 18 near


@pytest.mark.parametrize(("algorithm", "later_s"), [("token_bucket", 1), ("sliding_window", 15)])
def test_a_candidate_holds_only_what_it_would_have_admitted(algorithm: str, later_s: int) -> None:
    """A candidate of another algorithm charged past its room gives the rest back: refused
    requests take no tokens (no debt to pay off before the next one is admitted)."""
    clock = Clock()
    store = MemoryBackend(clock=clock, sweep_interval=0)
    config = CONFIG.replace(
        f"{{name: halve, requests_per_unit: {HALVE}}}",
        f"{{name: halve, requests_per_unit: 10, algorithm: {algorithm}}}",
    ).replace("unit: hour", "unit: second, unit_multiplier: 10")
    stream, metrics, _ = quota(config, store, clock)
    answer(stream, report(({"client": "a"}, 25, 0), elapsed=5))
    assert counts(metrics, "halve")[:2] == (25, 15)  # room for 10 of the 25
    # 1 s on, a token bucket has refilled one token (it would still owe 14 had it been charged
    # all 25); half a window into the next one, a sliding window counts 5 of the 10 before it
    # (12 of 25).
    clock.now += later_s
    answer(stream, report(({"client": "a"}, 1, 0), elapsed=later_s))
    assert counts(metrics, "halve")[:2] == (26, 15)


@pytest.mark.parametrize("algorithm", ["token_bucket", "sliding_window"])
async def test_a_candidate_is_given_back_what_it_was_charged_past_its_room(
    memory_or_redis: Backend, algorithm: str
) -> None:
    """The same on Redis, read from the store: after a report of 25 requests against a
    candidate with room for 10, its state holds 10, not 25 (an hour's refill is negligible)."""
    config = load_files([("q.yaml", CONFIG.replace(
        f"{{name: halve, requests_per_unit: {HALVE}}}",
        f"{{name: halve, requests_per_unit: 10, algorithm: {algorithm}}}",
    ))])
    (limit,) = limits_of(config.domains["q"])
    (cand,) = [c for c in limit.candidates if c.candidate == "halve"]
    dealer = Dealer(memory_or_redis, 10_000)
    key = f"t{random.getrandbits(32)}:client_a"
    grant = await dealer.report([Ledger(limit, key)], 25, 5, 0, demand=25)
    verdicts = {check.limit.candidate: out for check, out in grant.candidates}
    assert not verdicts["halve"].ok and verdicts["same"].ok
    verdict = await memory_or_redis.decide([Check(0, cand, key + cand.ident, 0)])
    assert verdict.outcomes[0].used == 10


async def test_top_lists_the_buckets_a_candidate_would_have_limited() -> None:
    stream, _, top = quota(CONFIG, MemoryBackend(sweep_interval=0))
    await actions(stream, report(({"client": "bob"}, 18, 7), elapsed=5))  # 25 of halve's 20
    rows = merge_candidates([top.snapshot()])["q"]
    assert rows == [{"limit": "q.client", "candidate": "halve", "descriptor": "client=bob",
                     "over": 5, "near": 4, "error": 0}]


async def test_a_domain_without_candidates_sends_none_to_the_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Costs nothing when absent: no candidate checks are even built."""
    def never(*_: object) -> None:
        raise AssertionError("candidate checks built")

    monkeypatch.setattr(Dealer, "_candidate_checks", never)
    plain = "domain: q\ndescriptors:\n  - key: client\n    rate_limit: {unit: hour, " \
        "requests_per_unit: 4}\n"
    stream, _, _ = quota(plain, MemoryBackend(sweep_interval=0))
    answered = await actions(stream, report(({"client": "a"}, 2, 1), elapsed=5))
    assert answered
    # and with candidates but nowhere to report them (a QuotaService built without a reporter)
    quiet, _, _ = quota(CONFIG, MemoryBackend(sweep_interval=0), counted=False)
    assert await actions(quiet, report(({"client": "a"}, 2, 1), elapsed=5))


def test_checks_are_counted_per_request_not_per_report() -> None:
    """rls_candidate_checks_total counts requests, as in per-request mode: a report of 0
    requests counts nothing."""
    stream, metrics, _ = quota(CONFIG, MemoryBackend(sweep_interval=0))
    answer(stream, report(({"client": "a"}, 0, 0), elapsed=5))
    assert counts(metrics, "same") == (0, 0, 0)
    answer(stream, report(({"client": "a"}, 3, 2), elapsed=5))
    assert counts(metrics, "same") == (5, 0, 0)
