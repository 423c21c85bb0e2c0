"""Memos bounded in bytes (issue 14 item 3): 12,000 distinct ~60 KB requests through a real
`rls serve` (counters in Redis) keep its RSS under 300 MB (the Helm chart's memory limit is
256 Mi; count-bounded memos took it to 865 MB), and the memo gauges report what is held,
within the budgets."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from conftest import start_redis
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from rls.memo import (
    MATCH_MEMO_BYTES,
    MATCH_MEMO_ENTRIES,
    PARSE_MEMO_BYTES,
    PARSE_MEMO_ENTRIES,
    BoundedCache,
)

from .helpers import metric

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
