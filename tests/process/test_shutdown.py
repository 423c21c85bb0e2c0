"""Shutdown (README "Operating it" / Shutdown): on SIGTERM /healthcheck turns 503, new calls are
refused, in-flight calls drain (up to 5 s), exit 0."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
from conftest import start_redis
from envoy.service.ratelimit.v3 import rls_pb2_grpc
from support.calls import OK, descriptor, request, uid

CHANNELS = 16
CALLERS = 2  # per channel: 32 calls always in flight

CONFIG = """
domain: down
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1000000}
"""


def health(url: str) -> int | str:
    """HTTP status of /healthcheck, or "refused" when nothing listens any more."""
    try:
        with urllib.request.urlopen(url + "/healthcheck", timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return "refused"


class HealthWatch(threading.Thread):
    """Polls /healthcheck and records every answer after `start()`."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.seen: list[int | str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            answer = health(self.url)
            self.seen.append(answer)
            if answer == "refused":
                return
            time.sleep(0.02)


async def decide(stub, value: str):
    return await stub.ShouldRateLimit(request("down", descriptor(("k", value))), timeout=15)


def test_sigterm_drains_calls_waiting_on_redis(spawner, tmp_path: Path):
    """Calls in flight (held by a paused Redis) when SIGTERM arrives complete with a real
    answer; meanwhile /healthcheck says 503; a call made during the shutdown delay is still
    answered (readiness already says 503, so balancers move away); exit 0."""
    config = tmp_path / "down.yaml"
    config.write_text(CONFIG)
    redis_server = start_redis()
    try:
        srv = spawner(config, args=("--redis-url", redis_server.url,
                                    "--backend-timeout-ms", "8000"))

        async def scenario() -> tuple[list, object, float, float, HealthWatch]:
            async with grpc.aio.insecure_channel(srv.grpc_addr) as channel:
                stub = rls_pb2_grpc.RateLimitServiceStub(channel)
                warm = await decide(stub, uid())  # script loaded, connection pool open
                assert warm.overall_code == OK
                redis_server.client().execute_command("CLIENT", "PAUSE", "2500", "ALL")
                paused = time.monotonic()
                inflight = [asyncio.ensure_future(decide(stub, uid())) for _ in range(20)]
                await asyncio.sleep(0.5)
                assert not any(f.done() for f in inflight), "Redis did not hold the calls"
                srv.proc.send_signal(signal.SIGTERM)
                signalled = time.monotonic()
                watch = HealthWatch(srv.http_url)
                watch.start()
                await asyncio.sleep(0.3)
                # A call made during the shutdown delay is still served (not refused, not lost).
                async with grpc.aio.insecure_channel(srv.grpc_addr) as fresh:
                    late_stub = rls_pb2_grpc.RateLimitServiceStub(fresh)
                    try:
                        late: object = await late_stub.ShouldRateLimit(
                            request("down", descriptor(("k", uid()))), timeout=5
                        )
                    except grpc.aio.AioRpcError as exc:
                        late = exc.code()
                results = await asyncio.gather(*inflight, return_exceptions=True)
                drained = time.monotonic() - paused
                watch.stop.set()
                return results, late, drained, signalled, watch

        results, late, drained, signalled, watch = asyncio.run(scenario())
        code = srv.proc.wait(timeout=10)
        exited = time.monotonic() - signalled
        failures = [r for r in results if not hasattr(r, "overall_code")]
        assert not failures, f"in-flight calls failed during the drain: {failures[:3]}"
        assert all(r.overall_code == OK for r in results)
        assert drained >= 2.0, "the calls finished before Redis was released?"
        assert getattr(late, "overall_code", None) == OK, f"a call after SIGTERM got {late}"
        assert 503 in watch.seen, f"/healthcheck during the drain: {watch.seen}"
        assert 200 not in watch.seen[watch.seen.index(503):], watch.seen
        assert code == 0, srv.log()
        assert exited < 10, f"exit {exited:.1f} s after SIGTERM"
    finally:
        redis_server.stop()


def test_sigterm_under_load(spawner, tmp_path: Path):
    """Memory backend, 32 concurrent callers in a loop: SIGTERM; calls sent before it and during
    the shutdown delay (`--shutdown-delay-ms 1000`) are answered; calls sent once the server
    stopped are refused (UNAVAILABLE); /healthcheck is 503 or gone; exit 0 within 10 s."""
    config = tmp_path / "down.yaml"
    config.write_text(CONFIG)
    srv = spawner(config)
    records: list[tuple[float, float, object]] = []  # (start, end, code or StatusCode)

    async def scenario() -> float:
        stop = asyncio.Event()

        async def caller(stub) -> None:
            while not stop.is_set():
                start = time.monotonic()
                try:
                    resp = await decide(stub, uid())
                    outcome: object = resp.overall_code
                except grpc.aio.AioRpcError as exc:
                    outcome = exc.code()
                records.append((start, time.monotonic(), outcome))
                if outcome == grpc.StatusCode.UNAVAILABLE:
                    await asyncio.sleep(0.05)

        async def client() -> None:
            async with grpc.aio.insecure_channel(srv.grpc_addr) as channel:
                stub = rls_pb2_grpc.RateLimitServiceStub(channel)
                await asyncio.gather(*(caller(stub) for _ in range(CALLERS)))

        tasks = [asyncio.ensure_future(client()) for _ in range(CHANNELS)]
        await asyncio.sleep(1.5)
        sigterm = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(2.5)
        stop.set()
        await asyncio.gather(*tasks)
        return sigterm

    sigterm = asyncio.run(scenario())
    after_signal = health(srv.http_url)
    code = srv.proc.wait(timeout=10)
    exited = time.monotonic() - sigterm
    assert code == 0, srv.log()
    assert exited < 10, f"exit {exited:.1f} s after SIGTERM"
    assert after_signal in (503, "refused"), after_signal

    def show(rows: list[tuple[float, float, object]]) -> str:
        return ", ".join(
            f"sent {a - sigterm:+.3f} s, ended {b - sigterm:+.3f} s: {c}" for a, b, c in rows[:4]
        )

    # Calls sent before the signal and during most of the shutdown delay are answered.
    before = [r for r in records if r[0] < sigterm + 0.7]
    assert len(before) >= 50, f"only {len(before)} calls before SIGTERM: no load"
    failed_before = [r for r in before if r[2] != OK]
    assert not failed_before, f"calls sent before the server stopped failed: {show(failed_before)}"
    # Calls sent well after the delay are refused cleanly.
    late = [r for r in records if r[0] > sigterm + 1.8]
    assert late, "no call was made after the shutdown delay"
    wrong = [r for r in late if r[2] != grpc.StatusCode.UNAVAILABLE]
    assert not wrong, f"calls after the shutdown delay were not refused: {show(wrong)}"
    odd = [r for r in records if r[2] not in (OK, grpc.StatusCode.UNAVAILABLE,
                                               grpc.StatusCode.CANCELLED)]
    assert not odd, f"calls around SIGTERM ended with other errors: {show(odd)}"


def test_sigterm_keeps_calls_that_arrived_before_it(spawner, tmp_path: Path):
    """Calls already sent on open connections when SIGTERM arrives (the server is frozen with
    SIGSTOP meanwhile, as a busy server would leave them queued) are answered, not cancelled."""
    config = tmp_path / "down.yaml"
    config.write_text(CONFIG)
    srv = spawner(config)

    async def scenario() -> list:
        channels = [grpc.aio.insecure_channel(srv.grpc_addr) for _ in range(4)]
        try:
            stubs = [rls_pb2_grpc.RateLimitServiceStub(c) for c in channels]
            for stub in stubs:  # connections up
                assert (await decide(stub, uid())).overall_code == OK
            srv.proc.send_signal(signal.SIGSTOP)
            try:
                calls = [asyncio.ensure_future(decide(stubs[i % 4], uid())) for i in range(20)]
                await asyncio.sleep(0.3)  # written to the server's sockets
                srv.proc.send_signal(signal.SIGTERM)
            finally:
                srv.proc.send_signal(signal.SIGCONT)
            return await asyncio.gather(*calls, return_exceptions=True)
        finally:
            for c in channels:
                await c.close()

    results = asyncio.run(scenario())
    code = srv.proc.wait(timeout=10)
    assert code == 0, srv.log()
    failed = [r.code() if isinstance(r, grpc.aio.AioRpcError) else r for r in results
              if not hasattr(r, "overall_code")]
    assert not failed, f"{len(failed)} of 20 calls sent before SIGTERM failed: {failed[:3]}"
