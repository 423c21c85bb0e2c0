"""Memos bounded in bytes (issue 14 item 3): 12,000 distinct ~60 KB requests through a real
`rls serve` (counters in Redis) keep its RSS under 300 MB (the Helm chart's memory limit is
256 Mi; count-bounded memos took it to 865 MB), and the memo gauges report what is held,
within the budgets.

The memory store bounded in bytes (issue 24 item 3): past `--memory-max-bytes` it drops expired
counters first, then the least recently used (a denied caller's counter counts as used), stays
within the bound, counts what it evicted in rls_memory_evictions_total, and its byte estimate
stays exact through every algorithm's charges, releases and drops."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from conftest import start_redis
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from support.metrics import metric

from rls.config.model import Limit, Unit
from rls.core.algorithms.registry import ALGORITHM_NAMES
from rls.core.model import NEGATIVE, Check
from rls.memo import (
    MATCH_MEMO_BYTES,
    MATCH_MEMO_ENTRIES,
    PARSE_MEMO_BYTES,
    PARSE_MEMO_ENTRIES,
    BoundedCache,
)
from rls.stores.memory import ENTRY_BYTES, LOW_WATER, MemoryBackend

CONFIG = """
domain: mem
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 4000000000}
"""
REQUESTS = 12_000
DESCRIPTORS = 60
VALUE_BYTES = 1000
RSS_LIMIT = 300 << 20


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def request(i: int) -> rls_pb2.RateLimitRequest:
    return rls_pb2.RateLimitRequest(domain="mem", descriptors=[
        {"entries": [{"key": "k", "value": f"{i:08d}-{j:03d}-".ljust(VALUE_BYTES, "x")}]}
        for j in range(DESCRIPTORS)
    ])


@pytest.fixture
def own_redis() -> Iterator[str]:
    """A Redis of its own: the 720,000 counters this test creates live there, not in rls."""
    server = start_redis()
    yield server.url
    server.stop()


def test_distinct_large_requests_keep_rss_bounded(rls_factory, tmp_path: Path,
                                                  own_redis: str) -> None:
    path = tmp_path / "mem.yaml"
    path.write_text(CONFIG)
    rls = rls_factory(path, args=("--redis-url", own_redis))
    assert request(0).ByteSize() > 60_000
    with grpc.insecure_channel(rls.grpc_addr) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)

        def send(start: int) -> None:
            for i in range(start, REQUESTS, 4):
                resp = stub.ShouldRateLimit(request(i), timeout=30)
                assert resp.overall_code == rls_pb2.RateLimitResponse.OK

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(send, range(4)))
    peak = rss(rls.proc.pid)
    held = {memo: metric(rls.http_url, "rls_memo_bytes", memo=memo)
            for memo in ("request_parse", "match")}
    entries = {memo: metric(rls.http_url, "rls_memo_entries", memo=memo)
               for memo in ("request_parse", "match")}
    assert peak < RSS_LIMIT, f"RSS {peak >> 20} MB after {REQUESTS} requests; memos {held}"
    assert 0 < held["request_parse"] <= PARSE_MEMO_BYTES
    assert 0 < held["match"] <= MATCH_MEMO_BYTES
    assert 0 < entries["request_parse"] <= PARSE_MEMO_ENTRIES
    assert 0 < entries["match"] <= MATCH_MEMO_ENTRIES


class Gauge:
    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float) -> None:
        self.value += amount


def test_bounded_cache_evicts_least_recently_used_within_bytes_and_entries() -> None:
    from rls import memo as memo_mod

    gauges = (Gauge(), Gauge())
    memo_mod.publish_to("unit-test", *gauges)
    cache = BoundedCache("unit-test", max_entries=3, max_bytes=3 * (100 + memo_mod.ENTRY_OVERHEAD))
    for key in "abc":
        cache.put(key, key.upper(), 100)
    assert cache.get("a") == "A"  # a is now the most recent
    cache.put("d", "D", 100)  # evicts b, the least recently used
    assert "b" not in cache and [cache.get(k) for k in "acd"] == ["A", "C", "D"]
    cache.put("big", "X", 250)  # needs the room of two entries
    assert len(cache) == 2 and "big" in cache and "d" in cache
    assert cache.nbytes <= cache.max_bytes
    cache.put("huge", "H", 10_000)  # larger than the whole budget: not kept
    assert "huge" not in cache
    assert gauges[0].value == cache.nbytes and gauges[1].value == len(cache)
    cache.clear()
    assert gauges[0].value == 0 and gauges[1].value == 0
    cache.put("z", "Z", 10)
    del cache  # a dropped memo (config reload) gives its bytes back
    assert gauges[0].value == 0 and gauges[1].value == 0


NOW = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def cost(key: str) -> int:
    return ENTRY_BYTES + len(key)


def held_bytes(store: MemoryBackend) -> int:
    return sum(cost(k) for k in store._data)


def test_memory_store_evicts_expired_first_then_least_recently_used() -> None:
    evicted: list[int] = []
    per_key = cost("k:00000")
    store = MemoryBackend(sweep_interval=0, max_bytes=100 * per_key, on_evict=evicted.append)
    second = Limit(1000, Unit.SECOND)
    hour = Limit(1, Unit.HOUR)
    for i in range(5):  # expired a few seconds later (window and grace)
        store.decide_now([Check(0, second, f"s:{i:05d}", 1)], NOW)
    for i in range(95):  # live all hour, one hit each: at their limit
        store.decide_now([Check(0, hour, f"k:{i:05d}", 1)], NOW)
    denied = store.decide_now([Check(0, hour, "k:00000", 1)], NOW + 5000)  # a use, denied
    assert not denied.admitted
    store.decide_now([Check(0, hour, "k:00001", 1)], NOW + 5000)
    assert evicted == [] and store.nbytes == held_bytes(store) == 100 * per_key
    store.decide_now([Check(0, hour, "k:99999", 1)], NOW + 5000)  # over the bound
    # The 5 expired went first (not counted as evictions), then the least recently used
    # live ones down to LOW_WATER: k:00002 onwards, never k:00000/k:00001 (used just now).
    target = 100 * per_key * LOW_WATER
    assert evicted == [6] and store.evictions == 6
    assert store.nbytes == held_bytes(store) <= target
    kept = set(store._data)
    assert not any(k.startswith("s:") for k in kept)
    assert {"k:00000", "k:00001", "k:99999"} <= kept
    assert kept.isdisjoint(f"k:{i:05d}" for i in range(2, 8))
    assert {f"k:{i:05d}" for i in range(8, 95)} <= kept
    # The survivors kept their counts: k:00000 is still over its limit.
    assert not store.decide_now([Check(0, hour, "k:00000", 1)], NOW + 6000).admitted


def test_memory_store_stays_within_its_bound_under_distinct_keys() -> None:
    evicted: list[int] = []
    bound = 1 << 20
    store = MemoryBackend(sweep_interval=0, max_bytes=bound, on_evict=evicted.append)
    hour = Limit(10, Unit.HOUR)
    for i in range(50_000):
        store.decide_now([Check(0, hour, f"user:{i}:" + "v" * (i % 200), 1)], NOW)
        assert store.nbytes <= bound
    assert store.nbytes == held_bytes(store)
    assert sum(evicted) == store.evictions == 50_000 - len(store._data) > 0


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
def test_memory_store_byte_estimate_is_exact_through_every_operation(algorithm: str) -> None:
    store = MemoryBackend(sweep_interval=0, max_bytes=40 * cost("a:000"))
    limits = [Limit(3, Unit.SECOND, algorithm=algorithm),
              Limit(3, Unit.SECOND, algorithm=algorithm, rolling=algorithm == "fixed_window")]
    for step in range(400):
        now = NOW + step * 137
        key = f"a:{step % 60:03d}"
        lim = limits[step % 2]
        checks = [Check(0, lim, key, 1 + step % 3, NEGATIVE if step % 7 == 0 else 0),
                  Check(1, lim, key, 1)]  # the same counter twice in one request
        store.decide_now(checks, now)
        assert store.nbytes == held_bytes(store), step
        assert store.nbytes <= store.max_bytes
        if step % 50 == 0:
            store.sweep(now)
            assert store.nbytes == held_bytes(store)


def test_rls_serve_memory_store_honours_its_bound_and_counts_evictions(rls_factory,
                                                                       tmp_path: Path) -> None:
    path = tmp_path / "mem.yaml"
    path.write_text(CONFIG)
    bound = 1 << 20
    rls = rls_factory(path, args=("--memory-max-bytes", str(bound)))
    sent = 6000
    with grpc.insecure_channel(rls.grpc_addr) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        for i in range(sent):
            req = rls_pb2.RateLimitRequest(domain="mem", descriptors=[
                {"entries": [{"key": "k", "value": f"user-{i:06d}"}]}])
            assert stub.ShouldRateLimit(req, timeout=10).overall_code == \
                rls_pb2.RateLimitResponse.OK
    evictions = metric(rls.http_url, "rls_memory_evictions_total")
    held = metric(rls.http_url, "rls_memory_store_bytes")
    assert 0 < held <= bound
    assert evictions > sent - bound / ENTRY_BYTES  # at least what cannot fit was evicted
