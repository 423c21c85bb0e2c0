"""No over-admission under concurrency, through real `rls serve` processes and gRPC.

Three processes share one Redis (and, separately, one process with the embedded memory
backend). The config has one descriptor per algorithm family (fixed_window, sliding_log,
token_bucket with burst 100, concurrency), each limited to 100 per hour. Per family, 50
concurrent grpc.aio clients spread over the processes make 40 calls each (the four families
run at the same time, on the same processes): exactly 100 calls are admitted and 1900 are
OVER_LIMIT, whichever process takes each call. `--backend-timeout-ms 2000` keeps slow calls out
of the failure mode, and /metrics must show no backend error.

The families share processes (one config) instead of one test each: starting three processes
per family would cost more than the calls themselves.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

CLIENTS = 50
CALLS = 40
LIMIT = 100

FAMILIES = {
    "fixed_window": "algorithm: fixed_window",
    "sliding_log": "algorithm: sliding_log",
    "token_bucket": "algorithm: token_bucket, burst: 100",
    "concurrency": "algorithm: concurrency",  # leases never released: 100 in flight, no more
}
EXPECTED = {family: (LIMIT, CLIENTS * CALLS - LIMIT) for family in FAMILIES}


def _config(tmp_path: Path) -> Path:
    lines = ["domain: noa", "descriptors:", "  - key: api", "    descriptors:"]
    for family, spec in FAMILIES.items():
        lines += [
            "      - key: family",
            f"        value: {family}",
            f"        rate_limit: {{unit: hour, requests_per_unit: {LIMIT}, {spec}}}",
        ]
    path = tmp_path / "noa.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


async def _storm(stubs: list[rls_pb2_grpc.RateLimitServiceStub], family: str) -> tuple[int, int]:
    """CLIENTS clients x CALLS calls, client i on process i % len(stubs): (OK, OVER_LIMIT)."""
    entry = ratelimit_pb2.RateLimitDescriptor.Entry
    descriptor = ratelimit_pb2.RateLimitDescriptor(
        entries=[entry(key="api", value="pay"), entry(key="family", value=family)]
    )
    request = rls_pb2.RateLimitRequest(domain="noa", descriptors=[descriptor], hits_addend=1)

    async def client(i: int) -> list[int]:
        stub = stubs[i % len(stubs)]
        return [
            (await stub.ShouldRateLimit(request, timeout=30)).overall_code for _ in range(CALLS)
        ]

    codes = [c for codes in await asyncio.gather(*map(client, range(CLIENTS))) for c in codes]
    ok = codes.count(rls_pb2.RateLimitResponse.OK)
    over = codes.count(rls_pb2.RateLimitResponse.OVER_LIMIT)
    return ok, over


async def _storms(addrs: list[str]) -> dict[str, tuple[int, int]]:
    channels = [grpc.aio.insecure_channel(a) for a in addrs]
    try:
        stubs = [rls_pb2_grpc.RateLimitServiceStub(c) for c in channels]
        counts = await asyncio.gather(*(_storm(stubs, f) for f in FAMILIES))
    finally:
        for c in channels:
            await c.close()
    return dict(zip(FAMILIES, counts, strict=True))


def _backend_errors(http_url: str) -> float:
    with urllib.request.urlopen(http_url + "/metrics", timeout=5) as resp:
        body = resp.read()
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith("rls_backend_errors_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _start(rls_factory: Callable[..., Any], config: Path, args: tuple[str, ...], n: int) -> list:
    """Start n processes at once, then wait for each to be healthy."""
    procs = [rls_factory(config, args=args, wait_healthy=False) for _ in range(n)]
    for p in procs:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(p.http_url + "/healthcheck", timeout=1) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert p.proc.poll() is None and time.monotonic() < deadline, p.log()
            time.sleep(0.05)
    return procs


def _stop(procs: list) -> None:
    """Terminate all at once (the fixture would stop them one after the other)."""
    for p in procs:
        p.proc.terminate()
    for p in procs:
        p.proc.wait(10)


def _same_hour() -> int:
    """The fixed window is an epoch-aligned hour: a storm that straddled its end would admit
    the limit twice. Wait for the next hour when less than a minute is left; the hour to check
    against afterwards."""
    left = 3600 - time.time() % 3600
    if left < 60:
        time.sleep(left + 0.5)  # a known wait for a clock boundary, not for readiness
    return int(time.time() // 3600)


async def test_three_processes_sharing_redis_admit_exactly_the_limit(
    rls_factory, redis_url: str, tmp_path: Path
) -> None:
    args = ("--redis-url", redis_url, "--backend-timeout-ms", "2000")
    hour = _same_hour()
    procs = _start(rls_factory, _config(tmp_path), args, 3)
    try:
        counts = await _storms([p.grpc_addr for p in procs])
        errors = [_backend_errors(p.http_url) for p in procs]
    finally:
        _stop(procs)
    assert errors == [0.0, 0.0, 0.0], f"backend errors {errors}"
    assert int(time.time() // 3600) == hour, "the storm straddled an hour's end"
    assert counts == EXPECTED  # per family: (admitted, over limit)


async def test_one_memory_process_admits_exactly_the_limit(rls_factory, tmp_path: Path) -> None:
    hour = _same_hour()
    procs = _start(rls_factory, _config(tmp_path), ("--backend-timeout-ms", "2000"), 1)
    try:
        counts = await _storms([procs[0].grpc_addr])
        errors = _backend_errors(procs[0].http_url)
    finally:
        _stop(procs)
    assert errors == 0.0
    assert int(time.time() // 3600) == hour, "the storm straddled an hour's end"
    assert counts == EXPECTED
