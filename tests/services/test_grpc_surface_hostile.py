"""The gRPC port under hostile callers (issue 24 item 6), on a real `rls serve` with the
response cache on (both gRPC listeners): garbage bytes, huge metadata, undecodable requests,
RLQS garbage and oversized reports, many streams, idle connections. Each attack must leave the
process serving (a health check answered within a deadline on a fresh connection), its log
free of tracebacks, and its RSS within RSS_GROWTH_LIMIT of where it started."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import RlsProcess, wait_until
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.grpc_surface import (
    RSS_GROWTH_LIMIT,
    assert_no_traceback,
    assert_serving,
    code_of,
    fresh_channel,
    longest_stall,
    loop_lags,
    rss,
    start_rls,
)
from support.metrics import metric

pytestmark = pytest.mark.process

RLQS = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEALTH = health_pb2.HealthCheckRequest(service="")


@pytest.fixture(scope="module")
def rls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RlsProcess]:
    """One process for the module: every check is on deltas or on a fresh connection."""
    server = start_rls(tmp_path_factory.mktemp("grpc-surface"))
    yield server
    server.stop()


def send_raw(port: int, payload: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        try:
            conn.sendall(payload)
            conn.shutdown(socket.SHUT_WR)
            conn.settimeout(5)
            while conn.recv(65536):  # until the server closes it
                pass
        except OSError:
            pass  # reset by the server: fine


def frame(kind: int, flags: int, stream: int, payload: bytes, length: int | None = None) -> bytes:
    size = len(payload) if length is None else length
    return size.to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


GARBAGE = {
    "random_bytes": bytes(range(256)) * 256,
    "http1_request": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "preface_then_garbage": H2_PREFACE + b"\xff" * 4096,
    # a HEADERS frame that declares 16 MiB - 1 (the most 24 bits hold) and sends 4 bytes
    "oversized_frame": H2_PREFACE + frame(4, 0, 0, b"")
    + frame(1, 4, 1, b"\x00" * 4, (1 << 24) - 1),
    # a SETTINGS frame whose length is not a multiple of 6
    "bad_settings": H2_PREFACE + frame(4, 0, 0, b"\x00" * 5),
    "headers_hpack_garbage": H2_PREFACE + frame(4, 0, 0, b"") + frame(1, 5, 1, b"\xff" * 64),
}


@pytest.mark.parametrize("listener", ["grpc", "extproc"])
def test_garbage_bytes_leave_both_grpc_listeners_serving(rls: RlsProcess, listener: str) -> None:
    port = rls.grpc_port if listener == "grpc" else rls.extproc_port
    base, lags = rss(rls.proc.pid), loop_lags(rls)
    for _ in range(20):
        for payload in GARBAGE.values():
            send_raw(port, payload)
    assert_serving(rls)
    growth = rss(rls.proc.pid) - base
    print(f"RSS growth after 120 garbage connections ({listener}): {growth / 2**20:.1f} MiB; "
          f"longest loop stall {longest_stall(rls, lags)}")
    assert growth < RSS_GROWTH_LIMIT
    assert_no_traceback(rls)


def test_idle_connections_that_never_speak_do_not_stop_the_port(rls: RlsProcess) -> None:
    conns = [socket.create_connection(("127.0.0.1", rls.grpc_port), timeout=5)
             for _ in range(300)]
    try:
        assert_serving(rls)
    finally:
        for conn in conns:
            conn.close()
    assert_serving(rls)


@pytest.mark.parametrize("size", [17_000, 1 << 20])
def test_huge_metadata_is_refused_cleanly(rls: RlsProcess, size: int) -> None:
    with grpc.insecure_channel(rls.grpc_addr) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        code = code_of(lambda: stub.Check(HEALTH, metadata=[("x-big", "a" * size)], timeout=10))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        many = [(f"x-h{i}", "v" * 20) for i in range(2000)]
        assert code_of(lambda: stub.Check(HEALTH, metadata=many, timeout=10)) \
            == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert_serving(rls)
    assert_no_traceback(rls)


@pytest.mark.parametrize("method", [
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    "/grpc.health.v1.Health/Check",
])
def test_undecodable_unary_requests_are_invalid_argument(rls: RlsProcess, method: str) -> None:
    with grpc.insecure_channel(rls.grpc_addr) as channel:
        call = channel.unary_unary(method)
        for raw in (b"\xff\xff\xff\x0f garbage", b"\x0a\x05ab"):
            assert code_of(lambda raw=raw: call(raw, timeout=10)) \
                == grpc.StatusCode.INVALID_ARGUMENT
    assert_no_traceback(rls)


def test_an_undecodable_health_watch_is_invalid_argument(rls: RlsProcess) -> None:
    with grpc.insecure_channel(rls.grpc_addr) as channel:
        watch = channel.unary_stream("/grpc.health.v1.Health/Watch")
        assert code_of(lambda: list(watch(b"\xff\xff\xff\x0f", timeout=10))) \
            == grpc.StatusCode.INVALID_ARGUMENT
    assert_no_traceback(rls)


def test_rlqs_garbage_and_oversized_reports_end_cleanly(rls: RlsProcess) -> None:
    with grpc.insecure_channel(rls.grpc_addr, options=[
            ("grpc.max_send_message_length", 64 << 20)]) as channel:
        stream = channel.stream_stream(RLQS)
        for messages in ([b"\xff\xff\xff\x0f garbage"], [b"\x0a\x05ab", b"\x12\xff"]):
            code = code_of(lambda m=messages: list(stream(iter(m), timeout=10)))
            assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT), code
        big = b"\x0a" + b"\x80\x80\x80\x03" + b"x" * (6 << 20)  # 6 MiB, over the port's cap
        assert code_of(lambda: list(stream(iter([big]), timeout=20))) \
            == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert_serving(rls)
    assert_no_traceback(rls)


def test_streams_per_connection_are_capped(tmp_path: Path) -> None:
    """With --max-concurrent-streams 4, a fifth call on the same connection waits (its
    deadline passes) while another connection is answered; it goes through once one ends."""
    rls = start_rls(tmp_path, "--max-concurrent-streams", "4")
    try:
        with grpc.insecure_channel(rls.grpc_addr) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            watches = [stub.Watch(HEALTH, timeout=60) for _ in range(4)]
            for watch in watches:
                assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
            assert code_of(lambda: stub.Check(HEALTH, timeout=2)) \
                == grpc.StatusCode.DEADLINE_EXCEEDED
            assert_serving(rls)  # a fresh connection
            watches[0].cancel()
            assert stub.Check(HEALTH, timeout=10).status == health_pb2.HealthCheckResponse.SERVING
            for watch in watches[1:]:
                watch.cancel()
    finally:
        rls.stop()


def test_a_thousand_open_streams_keep_memory_bounded(rls: RlsProcess) -> None:
    """10 connections x (50 health watches + 50 RLQS streams that never report): the port
    still decides on a fresh connection, and RSS grows by less than RSS_GROWTH_LIMIT."""
    request = rls_pb2.RateLimitRequest(domain="gateway", descriptors=[
        {"entries": [{"key": "remote_address", "value": "10.0.0.1"}]}])
    base, lags = rss(rls.proc.pid), loop_lags(rls)

    async def attack() -> tuple[float, str]:
        channels = [grpc.aio.insecure_channel(rls.grpc_addr, options=[
            ("grpc.use_local_subchannel_pool", 1)]) for _ in range(10)]
        calls: list[Any] = []
        try:
            for channel in channels:
                watch = channel.unary_stream(
                    "/grpc.health.v1.Health/Watch",
                    request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                    response_deserializer=health_pb2.HealthCheckResponse.FromString)
                quota = channel.stream_stream(RLQS)
                for i in range(50):
                    calls.append(watch(health_pb2.HealthCheckRequest(service=f"s{i}" * 100)))
                    calls.append(quota())  # opened, never written to: stays open
            for call in calls[::2]:
                await asyncio.wait_for(call.read(), 30)  # every watch open and answered
            await asyncio.to_thread(wait_until, lambda: metric(
                rls.http_url, "rls_quota_streams") == 500, 30, "500 open RLQS streams")
            await asyncio.to_thread(assert_serving, rls)
            with fresh_channel(rls.grpc_addr) as fresh:
                reply = await asyncio.to_thread(
                    rls_pb2_grpc.RateLimitServiceStub(fresh).ShouldRateLimit, request,
                    timeout=10)
            assert reply.overall_code in (rls_pb2.RateLimitResponse.OK,
                                          rls_pb2.RateLimitResponse.OVER_LIMIT)
            return rss(rls.proc.pid) - base, longest_stall(rls, lags)
        finally:
            for call in calls:
                call.cancel()
            for channel in channels:
                await channel.close()

    growth, stall = asyncio.run(attack())
    print(f"RSS growth with 1,000 open streams: {growth / 2**20:.1f} MiB; "
          f"longest loop stall {stall}")
    assert growth < RSS_GROWTH_LIMIT
    assert_serving(rls)
    assert_no_traceback(rls)
