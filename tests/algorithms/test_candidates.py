"""Candidate limits (YAML `candidates:`), differentially, on the memory store and a real Redis.

A candidate is counted beside its live limit with the same hits and never changes the answer;
it is charged as the live limit would be with the candidate in its place. So:
- a candidate equal to its live limit reports exactly the live over-limit decisions, request
  by request, also in requests whose other descriptors are limited too;
- on requests of one descriptor, any candidate reports exactly what an engine whose live limit
  *is* that candidate decides.
Times are injected and run ahead of the wall clock (Redis expires keys on its own clock).
"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from rls.config.loader import load_files
from rls.config.model import Limit
from rls.engine.limiter import OVER_LIMIT, DescriptorIn, RateLimiter
from rls.metrics import Metrics
from rls.settings import Settings
from rls.stores.base import Backend

LIVE = """
domain: cand
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 5}
    candidates:
      - {name: same, requests_per_unit: 5}
      - {name: halve, requests_per_unit: 2}
      - {name: sliding, requests_per_unit: 4, algorithm: sliding_window}
      - {name: bucket, requests_per_unit: 3, algorithm: token_bucket, burst: 4}
  - key: route
    rate_limits:
      - unit: second
        requests_per_unit: 8
        candidates: [{name: same, requests_per_unit: 8}]
"""

# The same domain with one candidate made the live limit (and no candidates).
AS_LIVE = {
    "halve": "rate_limit: {unit: second, requests_per_unit: 2}",
    "sliding": "rate_limit: {unit: second, requests_per_unit: 4, algorithm: sliding_window}",
    "bucket": "rate_limit: {unit: second, requests_per_unit: 3, algorithm: token_bucket, "
    "burst: 4}",
}


class Recording(Metrics):
    """Metrics that also keep every candidate verdict of the current request, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str, bool]] = []

    def record_candidate(self, domain: str, limit: Limit, over: bool, near: bool) -> None:
        super().record_candidate(domain, limit, over, near)
        self.seen.append((limit.full_key, limit.candidate, over))


def limiter(yaml: str, store: Backend, prefix: str, metrics: Metrics | None = None) -> RateLimiter:
    config = load_files([("c.yaml", yaml)], False)
    settings = Settings(key_prefix=prefix, local_cache=False)
    return RateLimiter(lambda: config, store, settings, metrics or Metrics())


def traffic(seed: int, n: int, both: bool) -> list[tuple[int, list[DescriptorIn]]]:
    """(now_ms, descriptors): bursts of one or two descriptors from a few users, 1-3 hits,
    the clock a few ms on per call from now (ahead of the wall clock, see the module doc)."""
    rng = random.Random(seed)
    now = int(time.time() * 1000) + 1000
    out = []
    for _ in range(n):
        now += rng.choice((0, 1, 5, 20, 60))
        hits = rng.randint(1, 3)
        descs = [DescriptorIn((("user", rng.choice("ab")),), hits=hits)]
        if both:
            descs.append(DescriptorIn((("route", rng.choice("xy")),), hits=hits))
        out.append((now, descs))
    return out


def counter(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_candidate_equal_to_its_live_limit_reports_exactly_the_live_over_limits(
    memory_or_redis: Backend,
) -> None:
    metrics = Recording()
    engine = limiter(LIVE, memory_or_redis, f"eq{random.getrandbits(32)}:", metrics)
    overs = {"cand.user": 0, "cand.route": 0}
    for now, descs in traffic(7, 600, both=True):
        metrics.seen.clear()
        decision = await engine.should_rate_limit("cand", descs, now_ms=now)
        index = {"cand.user": 0, "cand.route": 1}
        same = [(key, over) for key, name, over in metrics.seen if name == "same"]
        assert [key for key, _ in same] == ["cand.user", "cand.route"]
        for key, over in same:
            live_over = decision.statuses[index[key]].code == OVER_LIMIT
            assert over == live_over, (now, key)
            overs[key] += live_over
    assert all(n > 20 for n in overs.values()), overs  # the traffic does reach the limits
    for key, n in overs.items():
        assert counter(metrics, "rls_candidate_over_limit_total", domain="cand", limit=key,
                       candidate="same") == n
        assert counter(metrics, "rls_candidate_checks_total", domain="cand", limit=key,
                       candidate="same") == 600


@pytest.mark.parametrize("name", sorted(AS_LIVE))
async def test_a_candidate_reports_what_it_would_decide_as_the_live_limit(
    memory_or_redis: Backend, name: str
) -> None:
    metrics = Recording()
    tag = random.getrandbits(32)
    engine = limiter(LIVE, memory_or_redis, f"c{tag}:", metrics)
    as_live = LIVE.split("  - key: user")[0] + f"  - key: user\n    {AS_LIVE[name]}\n"
    reference = limiter(as_live, memory_or_redis, f"r{tag}:")
    differ = over = 0
    for now, descs in traffic(11, 500, both=False):
        metrics.seen.clear()
        decision = await engine.should_rate_limit("cand", descs, now_ms=now)
        would = [o for key, cand, o in metrics.seen if cand == name]
        expected = await reference.should_rate_limit("cand", descs, now_ms=now)
        assert would == [expected.statuses[0].code == OVER_LIMIT], now
        over += would[0]
        differ += would[0] != (decision.statuses[0].code == OVER_LIMIT)
    assert over > 20 and differ > 0  # it did limit, and not just where the live limit does


async def test_candidates_never_change_the_answer_nor_the_live_counters(
    memory_or_redis: Backend,
) -> None:
    """The same traffic with and without candidates: the same decisions, call by call."""
    tag = random.getrandbits(32)
    with_candidates = limiter(LIVE, memory_or_redis, f"w{tag}:")
    plain = "\n".join(
        line for line in LIVE.splitlines() if "candidates" not in line and "{name:" not in line
    )
    without = limiter(plain, memory_or_redis, f"o{tag}:")
    for now, descs in traffic(3, 400, both=True):
        a = await with_candidates.should_rate_limit("cand", descs, now_ms=now)
        b = await without.should_rate_limit("cand", descs, now_ms=now)
        assert _shape(a) == _shape(b), now


def _shape(decision: Any) -> list[tuple[int, int, int | None]]:
    return [(decision.overall, s.code, s.remaining) for s in decision.statuses]


async def test_top_lists_who_a_candidate_would_have_limited_apart_from_the_live_top() -> None:
    from rls.engine.top import merge_candidates, merge_top
    from rls.stores.memory import MemoryBackend

    engine = limiter(LIVE, MemoryBackend(sweep_interval=0), "t:")
    now = int(time.time() * 1000)
    for _ in range(3):  # bob: 3 calls, within the live 5/s, over the `halve` candidate's 2/s
        await engine.should_rate_limit("cand", [DescriptorIn((("user", "bob"),))], now_ms=now)
    snap = engine.top.snapshot()
    assert merge_top([snap]) == {}  # nobody was limited
    rows = merge_candidates([snap])["cand"]
    halve = [r for r in rows if r["candidate"] == "halve"]
    assert halve == [{"limit": "cand.user", "candidate": "halve", "descriptor": "user=bob",
                      "over": 1, "near": 1, "error": 0}]  # call 2 past 80 % of 2, call 3 over
    assert "same" not in {r["candidate"] for r in rows}  # 3 of 5: neither over nor near


def test_a_candidate_error_names_its_line_and_node() -> None:
    from rls.config.errors import ConfigError

    bad = LIVE.replace("{name: halve, requests_per_unit: 2}", "{name: halve, unit: fortnight}")
    with pytest.raises(ConfigError) as info:
        load_files([("c.yaml", bad)], False)
    assert info.value.line == 8 and info.value.node == "cand.user.rate_limit.candidates[1]"
    assert "requests_per_unit" in str(info.value)
