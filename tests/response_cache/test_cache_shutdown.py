"""SIGTERM and the cache's background writer, on a real `rls serve` and a real Redis: a store
still pending at SIGTERM is written before the process exits; one that cannot finish within
`write_drain_ms` is dropped, counted and logged, and the exit stays bounded.

Redis's `CLIENT PAUSE … WRITE` holds write commands while reads go on, so the miss is looked up
normally and its store is pending in the writer exactly when SIGTERM arrives.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from conftest import ROOT, RedisServer, RlsProcess, http_get, start_redis, wait_until
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from .helpers import request_headers as envoy_request_headers
from .helpers import response_body, response_headers

RULES = """
store: {store}
key_prefix: "sd:"
store_timeout_ms: 10000    # the paused write must outlast the SIGTERM, not time out
write_drain_ms: {drain}
rules:
- api: items
  methods: [GET]
"""


@pytest.fixture
def paused_redis() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.client().execute_command("CLIENT", "UNPAUSE")
    server.stop()


def miss_through_ext_proc(addr: str) -> list[pb.ProcessingResponse]:
    """One cacheable GET miss on a real gRPC stream, messages as Envoy 1.40 sends them."""
    messages = [
        envoy_request_headers("GET", "/items?page=1", api="items"),
        response_headers(length=4),
        response_body(b"page"),
    ]
    with grpc.insecure_channel(addr) as channel:
        process = channel.stream_stream(
            "/envoy.service.ext_proc.v3.ExternalProcessor/Process",
            request_serializer=pb.ProcessingRequest.SerializeToString,
            response_deserializer=pb.ProcessingResponse.FromString,
        )
        return list(process(iter(messages), timeout=10))


def write_queue(rls: RlsProcess) -> float:
    status, body = http_get(rls.http_url + "/metrics")
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith("rls_cache_write_queue "):
            return float(line.split()[1])
    raise AssertionError("rls_cache_write_queue not in /metrics")


def start_with_pending_write(rls_factory: Callable[..., RlsProcess], tmp_path: Path,
                             redis: RedisServer, drain_ms: int) -> RlsProcess:
    rules = tmp_path / "cache.yaml"
    rules.write_text(RULES.format(store=redis.url, drain=drain_ms))
    rls = rls_factory(ROOT / "config" / "example.yaml", args=("--cache-config", str(rules)),
                      env={"RLS_SHUTDOWN_DELAY_MS": "0"})
    redis.client().execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
    replies = miss_through_ext_proc(rls.extproc_addr)
    assert [r.WhichOneof("response") for r in replies] == [
        "request_headers", "response_headers", "response_body"
    ]
    wait_until(lambda: write_queue(rls) == 1, timeout=10, what="the store pending in the writer")
    return rls


def test_sigterm_drains_a_pending_store(rls_factory: Callable[..., RlsProcess], tmp_path: Path,
                                        paused_redis: RedisServer) -> None:
    rls = start_with_pending_write(rls_factory, tmp_path, paused_redis, drain_ms=20_000)
    rls.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "shutting down" in rls.log(), timeout=10, what="rls shutting down")
    assert rls.proc.poll() is None  # still waiting for the write
    paused_redis.client().execute_command("CLIENT", "UNPAUSE")
    assert rls.proc.wait(20) == 0, rls.log()
    assert len(paused_redis.client().keys("sd:e:items:*")) == 1, rls.log()
    assert "dropped" not in rls.log()


def test_sigterm_drain_is_bounded_and_counts_the_drop(rls_factory: Callable[..., RlsProcess],
                                                      tmp_path: Path,
                                                      paused_redis: RedisServer) -> None:
    rls = start_with_pending_write(rls_factory, tmp_path, paused_redis, drain_ms=200)
    rls.proc.send_signal(signal.SIGTERM)
    assert rls.proc.wait(20) == 0, rls.log()  # did not wait for the 60 s pause
    assert "1 writes still pending at shutdown, dropped" in rls.log()
    paused_redis.client().execute_command("CLIENT", "UNPAUSE")
    assert paused_redis.client().keys("sd:e:items:*") == []
