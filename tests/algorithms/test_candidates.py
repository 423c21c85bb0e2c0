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
from rls.observability.metrics import Metrics
from rls.settings import Settings
from rls.stores.base import Backend
from rls.stores.redis import RedisBackend

from .support import Guarded, retry_on_stall

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


def limiter(
    yaml: str, store: Backend | Guarded, prefix: str, metrics: Metrics | None = None,
    quota_mode: bool = False,
) -> RateLimiter:
    config = load_files([("c.yaml", yaml)], False)
    settings = Settings(key_prefix=prefix, local_cache=False, quota_mode=quota_mode,
                        backend_timeout_ms=10_000, overload_cap_ms=30_000)  # a loaded host
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


@pytest.fixture
def store(memory_or_redis: Backend) -> Backend | Guarded:
    """The store; Redis guarded against the machine stalling past the injected clock (its
    keys would then expire early: a false difference, and the test is run again)."""
    if isinstance(memory_or_redis, RedisBackend):
        return Guarded(memory_or_redis)
    return memory_or_redis


def counter(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("quota_mode", [False, True], ids=["per_request", "quota_mode"])
@retry_on_stall
async def test_a_candidate_equal_to_its_live_limit_reports_exactly_the_live_over_limits(
    store: Backend | Guarded, quota_mode: bool
) -> None:
    """Also with every limit a quota (the reference's QUOTA_MODE: a request is rejected only
    when all its quota descriptors are over), where the admission rule is another one."""
    metrics = Recording()
    engine = limiter(LIVE, store, f"eq{random.getrandbits(32)}:", metrics,
                     quota_mode=quota_mode)
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
    if store.name == "redis":  # candidates ride in the request's one EVALSHA
        assert counter(metrics, "rls_backend_roundtrips_total", backend="redis") == 600


@pytest.mark.parametrize("name", sorted(AS_LIVE))
@retry_on_stall
async def test_a_candidate_reports_what_it_would_decide_as_the_live_limit(
    store: Backend | Guarded, name: str
) -> None:
    metrics = Recording()
    tag = random.getrandbits(32)
    engine = limiter(LIVE, store, f"c{tag}:", metrics)
    as_live = LIVE.split("  - key: user")[0] + f"  - key: user\n    {AS_LIVE[name]}\n"
    reference = limiter(as_live, store, f"r{tag}:")
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


@retry_on_stall
async def test_candidates_never_change_the_answer_nor_the_live_counters(
    store: Backend | Guarded,
) -> None:
    """The same traffic with and without candidates: the same decisions, call by call."""
    tag = random.getrandbits(32)
    with_candidates = limiter(LIVE, store, f"w{tag}:")
    plain = "\n".join(
        line for line in LIVE.splitlines() if "candidates" not in line and "{name:" not in line
    )
    without = limiter(plain, store, f"o{tag}:")
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


def test_rls_top_prints_who_candidates_would_limit_in_a_table_of_their_own() -> None:
    import argparse

    from rls.cli.top import render

    payload = {
        "window": "1m", "sort": "over", "workers": 1, "domains": {},
        "candidates": {"cand": [{"limit": "cand.user", "candidate": "halve",
                                 "descriptor": "user=bob", "over": 7, "near": 1, "error": 0}]},
    }
    text = render(payload, argparse.Namespace(admin="http://x"))
    assert "WOULD BE LIMITED BY CANDIDATE LIMITS" in text
    table = text.split("WOULD BE LIMITED BY CANDIDATE LIMITS (not enforced)\n", 1)[1]
    assert table.splitlines()[1:] == [
        "cand.user ~ halve",
        f"{'cand':<20} {7:>10} {1:>10} {0:>8}  user=bob",
    ]
    assert max(map(len, text.splitlines())) <= 80  # an 80-column terminal shows it whole
    assert "WOULD BE" not in render({**payload, "candidates": {}},
                                    argparse.Namespace(admin="http://x"))


async def test_a_domain_without_candidates_never_takes_the_candidate_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Costs nothing when absent: the limiter does not even look for candidates."""
    import rls.engine.limiter as limiter_module
    from rls.stores.memory import MemoryBackend

    def never(*_: object) -> None:
        raise AssertionError("candidate path taken")

    monkeypatch.setattr(limiter_module, "with_candidates", never)
    plain = "domain: plain\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, " \
        "requests_per_unit: 1}\n"
    engine = limiter(plain, MemoryBackend(sweep_interval=0), "p:")
    config = load_files([("c.yaml", plain)], False)
    assert not config.domains["plain"].has_candidates
    codes = [(await engine.should_rate_limit("plain", [DescriptorIn((("user", "a"),))],
                                             now_ms=1_000)).overall for _ in range(2)]
    assert codes == [1, OVER_LIMIT]


@retry_on_stall
async def test_two_descriptors_on_one_counter_fold_their_candidates_too(
    store: Backend | Guarded,
) -> None:
    """`user=a` twice in one request: one live counter charged with both hits, and so is the
    candidate's (its twin's index follows the fold)."""
    metrics = Recording()
    engine = limiter(LIVE, store, f"f{random.getrandbits(32)}:", metrics)
    now = int(time.time() * 1000) + 1000
    for i in range(4):
        metrics.seen.clear()
        descs = [DescriptorIn((("user", "a"),), hits=1), DescriptorIn((("user", "a"),), hits=2),
                 DescriptorIn((("route", "x"),), hits=3)]
        decision = await engine.should_rate_limit("cand", descs, now_ms=now + i)
        same = [over for _, name, over in metrics.seen if name == "same"]
        live = [s.code == OVER_LIMIT for s in decision.statuses]
        assert same == live, i
        # 3 hits a call against 5 a second (user), 3 against 8 (route): call 2 is over for the
        # user. The hits are explicit costs, charged even in a rejected request (Limit.charge):
        # the route has 6 after call 2, and call 3 is over for it too.
        assert live == ([False] * 3 if i == 0 else [True, True, i >= 2])
