"""Exactly the limit, under the concurrency production breaks on.

Each scenario starts rls processes cold on a fresh Redis (separate `rls serve` processes, or
one `--workers N` supervisor), optionally with a CPU hog beside them (a busy loop that takes one
of the machine's cores), and fires a burst the moment they report ready: many concurrent gRPC
clients, each on its own connection, each sending its calls back to back. rls runs with its
production defaults (no generous --backend-timeout-ms). Per limited descriptor:

- exactly `limit` calls are admitted;
- every admitted call was decided by the store: its status carries `current_limit`, and the
  admitted calls' `limit_remaining` values are all distinct (limit-1 … 0);
- no call was answered by the failure mode (`rls_failure_mode_answers_total` stays 0);
- nothing else: every other call is OVER_LIMIT (an UNAVAILABLE answer would be allowed by the
  contract under overload, but is not expected here and would show in the counts).

All algorithm families run at once in the first scenario (one descriptor each), on limits per
day so that no refill happens during the burst.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import RedisServer, start_redis, wait_until
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.slow

OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT

FAMILIES = {
    "fixed_window": "algorithm: fixed_window",
    "sliding_window": "algorithm: sliding_window",
    "sliding_log": "algorithm: sliding_log",
    "token_bucket": "algorithm: token_bucket",
    "leaky_bucket": "algorithm: leaky_bucket",
    "gcra": "algorithm: gcra",
    "concurrency": "algorithm: concurrency",  # leases never released in the burst
}


@pytest.fixture
def cpu_hog() -> Iterator[subprocess.Popen[bytes]]:
    """A busy neighbour: one process spinning on a core for the whole test."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def fresh_redis() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()


def write_config(tmp_path: Path, limit: int, families: dict[str, str]) -> Path:
    lines = ["domain: exact", "descriptors:", "  - key: family", "    descriptors:"]
    for family, spec in families.items():
        lines += [
            "      - key: name",
            f"        value: {family}",
            f"        rate_limit: {{unit: day, requests_per_unit: {limit}, {spec}}}",
        ]
    path = tmp_path / "exact.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class Tally:
    admitted_remaining: list[int] = field(default_factory=list)
    admitted_undecided: int = 0
    over: int = 0
    errors: dict[str, int] = field(default_factory=dict)


def request_for(family: str) -> rls_pb2.RateLimitRequest:
    entry = ratelimit_pb2.RateLimitDescriptor.Entry
    descriptor = ratelimit_pb2.RateLimitDescriptor(
        entries=[entry(key="family", value="f"), entry(key="name", value=family)]
    )
    return rls_pb2.RateLimitRequest(domain="exact", descriptors=[descriptor], hits_addend=1)


async def burst(
    addrs: list[str], families: list[str], clients: int, calls: int
) -> dict[str, Tally]:
    """`clients` clients per family, each on its own connection, `calls` calls each."""
    tallies = {family: Tally() for family in families}
    channels: list[grpc.aio.Channel] = []

    async def client(index: int, family: str) -> None:
        # A local subchannel pool: every client opens its own connection, so SO_REUSEPORT
        # spreads them over --workers the way many Envoys would.
        channel = grpc.aio.insecure_channel(
            addrs[index % len(addrs)], options=[("grpc.use_local_subchannel_pool", 1)]
        )
        channels.append(channel)
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        request = request_for(family)
        tally = tallies[family]
        for _ in range(calls):
            try:
                # No deadline sent: rls budgets the call with its own defaults.
                response = await asyncio.wait_for(stub.ShouldRateLimit(request), 30)
            except grpc.aio.AioRpcError as exc:
                name = exc.code().name
                tally.errors[name] = tally.errors.get(name, 0) + 1
                continue
            status = response.statuses[0]
            if response.overall_code == OK:
                if status.HasField("current_limit"):
                    tally.admitted_remaining.append(status.limit_remaining)
                else:
                    tally.admitted_undecided += 1
            else:
                tally.over += 1

    try:
        await asyncio.gather(
            *(client(i, family) for family in families for i in range(clients))
        )
    finally:
        await asyncio.gather(*(c.close() for c in channels))
    return tallies


def failure_answers(http_url: str) -> dict[str, float]:
    """Calls answered by the failure mode, by `reason/answer` (empty when none)."""
    with urllib.request.urlopen(http_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    found: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == "rls_failure_mode_answers":
            for s in fam.samples:
                if s.name.endswith("_total") and s.value:
                    key = f"{s.labels['reason']}/{s.labels['answer']}"
                    found[key] = found.get(key, 0.0) + s.value
    return found


def ready_workers(log: str) -> int:
    return log.count("store redis ready") + log.count("store memory ready")


def start_cold(
    rls_factory: Callable[..., Any], config: Path, args: tuple[str, ...], processes: int,
    workers: int = 1,
) -> list[Any]:
    """Start every process at once; return as soon as each reports ready (all its workers)."""
    extra = args + (("--workers", str(workers)) if workers > 1 else ())
    procs = [rls_factory(config, args=extra, wait_healthy=False) for _ in range(processes)]
    for p in procs:
        try:
            wait_until(lambda p=p: ready_workers(p.log()) >= workers, timeout=60,
                       what=f"{workers} worker(s) ready")
            wait_until(lambda p=p: urllib.request.urlopen(p.http_url + "/healthcheck",
                                                          timeout=1).status == 200,
                       timeout=60, what="rls /healthcheck")
        except TimeoutError:
            raise AssertionError(f"rls did not become ready:\n{p.log()}") from None
    return procs


def check_exact(tallies: dict[str, Tally], limit: int, procs: list[Any]) -> None:
    answered_by_failure_mode = [failure_answers(p.http_url) for p in procs]
    report = {
        family: (len(t.admitted_remaining), t.admitted_undecided, t.over, t.errors)
        for family, t in tallies.items()
    }
    assert answered_by_failure_mode == [{}] * len(procs), (answered_by_failure_mode, report)
    for family, tally in tallies.items():
        assert tally.admitted_undecided == 0, (family, report)
        assert len(tally.admitted_remaining) == limit, (family, report)
        assert sorted(tally.admitted_remaining) == list(range(limit)), (family, report)
        assert not tally.errors, (family, report)


def stop_all(procs: list[Any]) -> None:
    for p in procs:
        p.proc.terminate()
    for p in procs:
        try:
            p.proc.wait(15)
        except subprocess.TimeoutExpired:
            p.proc.kill()
            p.proc.wait()


async def test_two_cold_processes_with_a_cpu_hog_admit_exactly_the_limit_for_every_algorithm(
    rls_factory, fresh_redis: RedisServer, tmp_path: Path, cpu_hog
) -> None:
    limit, clients, calls = 100, 50, 4  # per family: 200 calls for a limit of 100
    config = write_config(tmp_path, limit, FAMILIES)
    procs = start_cold(rls_factory, config, ("--redis-url", fresh_redis.url), 2)
    try:
        tallies = await burst([p.grpc_addr for p in procs], list(FAMILIES), clients, calls)
        check_exact(tallies, limit, procs)
    finally:
        stop_all(procs)


@pytest.mark.parametrize(
    ("processes", "workers", "limit", "clients", "calls", "hog"),
    [
        pytest.param(2, 1, 100, 50, 20, True, id="2-processes-50-clients-limit-100-hog"),
        pytest.param(1, 2, 1000, 200, 8, True, id="workers-2-200-clients-limit-1000-hog"),
        pytest.param(4, 1, 1, 100, 3, False, id="4-processes-100-clients-limit-1"),
        pytest.param(1, 4, 10, 100, 2, True, id="workers-4-100-clients-limit-10-hog"),
        pytest.param(1, 1, 500, 200, 5, True, id="1-process-200-clients-limit-500-hog"),
    ],
)
async def test_cold_burst_admits_exactly_the_limit(
    rls_factory, fresh_redis: RedisServer, tmp_path: Path, request: pytest.FixtureRequest,
    processes: int, workers: int, limit: int, clients: int, calls: int, hog: bool,
) -> None:
    if hog:
        request.getfixturevalue("cpu_hog")
    config = write_config(tmp_path, limit, {"fixed_window": FAMILIES["fixed_window"]})
    procs = start_cold(rls_factory, config, ("--redis-url", fresh_redis.url), processes, workers)
    try:
        started = time.monotonic()
        tallies = await burst([p.grpc_addr for p in procs], ["fixed_window"], clients, calls)
        elapsed = time.monotonic() - started
        check_exact(tallies, limit, procs)
        assert tallies["fixed_window"].over == clients * calls - limit, elapsed
    finally:
        stop_all(procs)


async def test_memory_store_with_a_cpu_hog_admits_exactly_the_limit(
    rls_factory, tmp_path: Path, cpu_hog
) -> None:
    config = write_config(tmp_path, 100, FAMILIES)
    procs = start_cold(rls_factory, config, (), 1)
    try:
        tallies = await burst([procs[0].grpc_addr], list(FAMILIES), 50, 4)
        check_exact(tallies, 100, procs)
    finally:
        stop_all(procs)
