"""Candidate limits on a Redis Cluster (3 masters), where a request's counters, and a
candidate's counter and its live twin's, can live on different masters (the two-step
evaluate / charge of rls/stores/redis/): a candidate equal to its live limit still reports
exactly the live over-limit decisions."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
from algorithms.test_candidates import Recording

import rls.stores.redis.connect as redis_connect
from rls.config.loader import load_files
from rls.engine.limiter import OVER_LIMIT, DescriptorIn, RateLimiter
from rls.settings import Settings
from rls.stores.redis import RedisBackend
from rls.stores.windows import window_key

from .servers import ClusterTopology
from .test_cluster import IN_PROCESS_TIMEOUT_MS, _ClusterWithoutRetryOnTimeout

pytestmark = pytest.mark.redis

CONFIG = """
domain: cc
descriptors:
  - key: a
    rate_limit: {unit: year, requests_per_unit: 4}
    candidates: [{name: same, requests_per_unit: 4}, {name: low, requests_per_unit: 2}]
  - key: b
    rate_limit: {unit: year, requests_per_unit: 6}
    candidates: [{name: same, requests_per_unit: 6}]
"""


YEAR_MS = 31_536_000_000


async def test_an_equal_candidate_reports_the_live_over_limits_across_cluster_slots(
    fresh_cluster: ClusterTopology, monkeypatch: Any
) -> None:
    monkeypatch.setattr(redis_connect, "RedisCluster", _ClusterWithoutRetryOnTimeout)
    config = load_files([("cc.yaml", CONFIG)])
    metrics = Recording()
    backend = RedisBackend(fresh_cluster.url, timeout_ms=IN_PROCESS_TIMEOUT_MS,
                           connect_timeout_ms=IN_PROCESS_TIMEOUT_MS)
    settings = Settings(redis_url=fresh_cluster.url, backend_timeout_ms=IN_PROCESS_TIMEOUT_MS,
                        local_cache=False)
    limiter = RateLimiter(lambda: config, backend, settings, metrics)
    await backend.start()
    try:
        rng = random.Random(2)
        values = [f"v{i}" for i in range(4)]
        spread = set()
        overs = 0
        for _ in range(80):
            a, b = rng.choice(values), rng.choice(values)
            descs = [DescriptorIn((("a", a),)), DescriptorIn((("b", b),))]
            metrics.seen.clear()
            decision = await limiter.should_rate_limit("cc", descs)
            index = {"cc.a": 0, "cc.b": 1}
            for key, name, over in metrics.seen:
                if name == "same":
                    live = decision.statuses[index[key]].code == OVER_LIMIT
                    assert over == live, (a, b, key)
                    overs += live
            now = int(time.time() * 1000)
            for key in (f"rl:cc|a|{a}|f31536000", f"rl:cc|a|{a}|f31536000~same~f31536000"):
                spread.add(fresh_cluster.slot_owner(window_key(key, YEAR_MS, now)).port)
        assert overs > 10
        assert len(spread) > 1  # the counters really are on several masters
    finally:
        await backend.close()


async def test_quota_stream_candidates_count_across_cluster_slots(
    fresh_cluster: ClusterTopology, monkeypatch: Any
) -> None:
    """An RLQS report settles the live reservation and charges the candidates in one store
    call, whose keys span masters here: each candidate still reports the requests past its
    room, report by report."""
    from quota.test_candidates import CONFIG, HALVE, LIMIT, counts, model, quota
    from quota.test_service import actions, report

    monkeypatch.setattr(redis_connect, "RedisCluster", _ClusterWithoutRetryOnTimeout)
    backend = RedisBackend(fresh_cluster.url, timeout_ms=IN_PROCESS_TIMEOUT_MS,
                           connect_timeout_ms=IN_PROCESS_TIMEOUT_MS)
    await backend.start()
    try:
        stream, metrics, _ = quota(CONFIG, backend)
        rng = random.Random(4)
        used = {(c, n): 0 for c in "abcd" for n in ("same", "halve")}
        expected = {"same": [0, 0, 0], "halve": [0, 0, 0]}
        for _ in range(16):
            client = rng.choice("abcd")
            allowed, denied = rng.randint(0, 9), rng.randint(0, 4)
            await actions(stream, report(({"client": client}, allowed, denied), elapsed=5))
            for name, limit in (("same", LIMIT), ("halve", HALVE)):
                over, near = model(used[client, name], allowed + denied, limit)
                used[client, name] += allowed + denied
                expected[name] = [expected[name][0] + allowed + denied,
                                  expected[name][1] + over, expected[name][2] + near]
                assert counts(metrics, name) == tuple(expected[name]), (client, name)
        assert expected["halve"][1] > 0
    finally:
        await backend.close()
