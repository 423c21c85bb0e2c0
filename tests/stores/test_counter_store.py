"""The store contract, once, against every store rls decides with.

The same tests run on the embedded memory store, Redis standalone, a 3-master Redis Cluster
(checks of one request spread over different slots) and the local fallback (what answers while
the store is away, here with share 1.0 so its limits are the configured ones). They pin what
the engine relies on from any store (rls/stores/base.py `Backend`):

- admission: a window admits exactly its limit, each admitted hit with a distinct remaining;
- atomicity: a refused request charges none of its checks; concurrent requests never admit
  more than the limit;
- reads: a 0-hit check and `peek` charge nothing;
- releases: a negative hit gives back only where the limit accepts releases;
- windows: a new window starts from zero, and reset counts down to it.

Deep per-algorithm equivalence (hypothesis traces, reference models) lives in
tests/algorithms/; this suite is what a new store must pass first.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import pytest

from rls.config.model import Limit, Unit
from rls.core.algorithms.registry import ALGORITHM_NAMES
from rls.core.model import NEGATIVE, Check, Verdict
from rls.engine.fallback import FallbackLimiter
from rls.observability.metrics import Metrics
from rls.stores.memory import MemoryBackend
from rls.stores.redis import RedisBackend
from stores.topologies.servers import ClusterTopology, start_cluster

BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: every window of these tests starts here
ALGORITHMS = ALGORITHM_NAMES  # every registered algorithm, a new one included
_RUN = uuid.uuid4().hex[:8]
_SEQ = itertools.count()


class FallbackStore:
    """The local fallback behind the store interface (share 1.0: the configured limits)."""

    name = "fallback"

    def __init__(self) -> None:
        self._limiter = FallbackLimiter(1.0, Metrics())

    async def decide(self, checks: Sequence[Check], now_ms: int | None = None) -> Verdict:
        outcomes = self._limiter.decide(list(checks), now_ms)
        return Verdict(all(o.ok for o in outcomes), outcomes)

    async def close(self) -> None:
        return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterTopology]:
    topo = start_cluster(Path(tmp_path_factory.mktemp("contract-cluster")), masters=3)
    try:
        yield topo
    finally:
        topo.stop()


STORES = ("memory", "redis", "cluster", "fallback")


@pytest.fixture(params=STORES)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[object]:
    kind = request.param
    if kind == "memory":
        yield MemoryBackend(sweep_interval=0)
        return
    if kind == "fallback":
        yield FallbackStore()
        return
    url = (request.getfixturevalue("redis_url") if kind == "redis"
           else request.getfixturevalue("cluster").url)
    backend = RedisBackend(url, timeout_ms=5000, connect_timeout_ms=5000)
    await backend.start()
    yield backend
    await backend.close()


def key(tag: str) -> str:
    """A fresh counter key; different tags land in different Cluster slots."""
    return f"contract:{_RUN}:{next(_SEQ)}:{tag}"


def limit(algorithm: str, rpu: int, **extra: object) -> Limit:
    return Limit(rpu, Unit.MINUTE, algorithm=algorithm, **extra)  # type: ignore[arg-type]


async def decide(store: object, checks: list[Check], now: int = BASE_MS) -> Verdict:
    return await store.decide(checks, now)  # type: ignore[attr-defined, no-any-return]


async def one(store: object, lim: Limit, k: str, hits: int = 1, now: int = BASE_MS,
              flags: int = 0) -> Verdict:
    return await decide(store, [Check(0, lim, k, hits, flags)], now)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_a_window_admits_exactly_its_limit_with_distinct_remaining(
    store: object, algorithm: str
) -> None:
    lim, k = limit(algorithm, 5), key("exact")
    answers = [await one(store, lim, k) for _ in range(8)]
    assert [v.admitted for v in answers] == [True] * 5 + [False] * 3
    assert [v.outcomes[0].remaining for v in answers[:5]] == [4, 3, 2, 1, 0]
    assert all(v.outcomes[0].remaining == 0 and not v.outcomes[0].charged for v in answers[5:])


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_a_refused_request_charges_none_of_its_checks(store: object, algorithm: str) -> None:
    roomy, tight = limit(algorithm, 10), limit(algorithm, 1)
    a, b = key("roomy"), key("tight")
    first = await decide(store, [Check(0, roomy, a, 1), Check(1, tight, b, 1)])
    second = await decide(store, [Check(0, roomy, a, 1), Check(1, tight, b, 1)])
    assert first.admitted and not second.admitted
    assert [o.charged for o in second.outcomes] == [False, False]
    # the roomy counter still holds one hit: 9 left before this read, 9 after it
    read = await one(store, roomy, a, hits=0)
    assert read.outcomes[0].used == 1 and read.outcomes[0].remaining == 9


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_a_zero_hit_check_reads_without_charging(store: object, algorithm: str) -> None:
    lim, k = limit(algorithm, 3), key("read")
    await one(store, lim, k, hits=2)
    reads = [await one(store, lim, k, hits=0) for _ in range(5)]
    assert all(v.admitted for v in reads)  # (`charged` may say its 0 hits were recorded)
    assert {(v.outcomes[0].used, v.outcomes[0].remaining) for v in reads} == {(2, 1)}
    assert (await one(store, lim, k, hits=1)).admitted  # the third hit still fits


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_a_weighted_hit_above_what_remains_is_refused_and_charges_nothing(
    store: object, algorithm: str
) -> None:
    lim, k = limit(algorithm, 10), key("weighted")
    assert (await one(store, lim, k, hits=7)).admitted
    refused = await one(store, lim, k, hits=4)
    assert not refused.admitted and not refused.outcomes[0].charged
    assert (await one(store, lim, k, hits=3)).outcomes[0].remaining == 0


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_log", "concurrency"])
async def test_a_release_gives_back_and_never_below_zero(store: object, algorithm: str) -> None:
    # Stores apply every NEGATIVE check; whether a limit accepts releases is the engine's rule.
    lim, k = limit(algorithm, 2), key("release")
    assert (await one(store, lim, k)).admitted and (await one(store, lim, k)).admitted
    assert not (await one(store, lim, k)).admitted
    await one(store, lim, k, hits=5, flags=NEGATIVE)  # more than was ever charged
    assert (await one(store, lim, k, hits=0)).outcomes[0].used == 0
    assert (await one(store, lim, k, hits=2)).admitted


async def test_a_new_window_starts_from_zero_and_reset_counts_down_to_it(store: object) -> None:
    lim, k = limit("fixed_window", 2), key("roll")
    at = BASE_MS + 45_000  # 15 s before the minute ends
    assert (await one(store, lim, k, now=at)).outcomes[0].reset_ms == 15_000
    await one(store, lim, k, now=at)
    over = await one(store, lim, k, now=at + 5_000)
    assert not over.admitted and over.outcomes[0].reset_ms == 10_000
    fresh = await one(store, lim, k, now=BASE_MS + 60_000)
    assert fresh.admitted and fresh.outcomes[0].used == 0


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_log", "token_bucket"])
async def test_concurrent_requests_never_admit_more_than_the_limit(
    store: object, algorithm: str
) -> None:
    lim, k, other = limit(algorithm, 20), key("burst"), key("burst-other")
    roomy = limit(algorithm, 1000)
    answers = await asyncio.gather(*(
        decide(store, [Check(0, lim, k, 1), Check(1, roomy, other, 1)]) for _ in range(60)
    ))
    admitted = [v for v in answers if v.admitted]
    assert len(admitted) == 20
    assert sorted(v.outcomes[0].remaining for v in admitted) == list(range(20))
    # every refused request charged neither check: the roomy counter saw exactly 20 hits
    assert (await one(store, roomy, other, hits=0)).outcomes[0].used == 20
