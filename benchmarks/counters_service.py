"""Counters service throughput and latency (issue 17): `rls.counters.v1` over gRPC on Redis.

Starts its own redis-server and one `rls serve` process (free loopback ports) and measures:
1. BatchAdd of 30 items with 100 concurrent callers (closed loop): items/s, p50/p99 per batch;
2. single Add with 100 concurrent callers (closed loop): the peak calls/s;
3. single Add, then single Get, paced at half that peak (open loop, latency counted from each
   call's scheduled start so queueing is not hidden): p50/p99.
Every phase is bounded in time; the whole run takes about `--seconds` x 4 plus start-up.

    python benchmarks/counters_service.py --seconds 8

Targets (issue 17): >= 20,000 items/s per process in batches of 30, p99 < 50 ms at 100
callers; single Add/Get p99 < 5 ms at half of peak. The client runs on the same 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import start_redis, start_rls, workdir, write_config

from rls.counters.proto import counters_pb2 as pb

SERVICE = "/rls.counters.v1.Counters/"
KEYS = 10_000


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


def item(i: int) -> pb.CounterRequest:
    return pb.CounterRequest(domain="ads", key=f"user:{i}:impressions", time_span=1,
                             time_unit=pb.DAY, hits=1)


async def closed_loop(call, bodies: list[bytes], callers: int, seconds: float):
    """`callers` tasks each calling back to back until the deadline; (latencies, errors)."""
    lat: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal errors
        rnd = random.Random()
        while time.perf_counter() < deadline:
            body = bodies[rnd.randrange(len(bodies))]
            t0 = time.perf_counter()
            try:
                await call(body, timeout=5)
            except grpc.RpcError:
                errors += 1
                continue
            lat.append(time.perf_counter() - t0)

    await asyncio.gather(*(worker() for _ in range(callers)))
    return lat, errors


async def open_loop(call, bodies: list[bytes], rate: float, seconds: float):
    """Calls started at `rate`/s on schedule; latency from the scheduled start."""
    lat: list[float] = []
    errors = 0
    tasks = []
    start = time.perf_counter()
    n = int(rate * seconds)

    async def one(at: float, body: bytes) -> None:
        nonlocal errors
        try:
            await call(body, timeout=5)
        except grpc.RpcError:
            errors += 1
            return
        lat.append(time.perf_counter() - at)

    for i in range(n):
        at = start + i / rate
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(at, bodies[i % len(bodies)])))
    await asyncio.gather(*tasks)
    return lat, errors


async def run(addr: str, seconds: float, callers: int) -> None:
    async with grpc.aio.insecure_channel(addr) as channel:
        batch_add = channel.unary_unary(SERVICE + "BatchAdd")
        add = channel.unary_unary(SERVICE + "Add")
        get = channel.unary_unary(SERVICE + "Get")
        rnd = random.Random(1)
        batches = [
            pb.BatchRequest(items=[item(rnd.randrange(KEYS)) for _ in range(30)])
            .SerializeToString()
            for _ in range(500)
        ]
        singles = [item(i).SerializeToString() for i in range(KEYS)]
        await closed_loop(batch_add, batches, 10, 1.0)  # warm-up

        lat, err = await closed_loop(batch_add, batches, callers, seconds)
        print(f"BatchAdd x30, {callers} callers: {len(lat) * 30 / seconds:,.0f} items/s "
              f"({len(lat) / seconds:,.0f} batches/s), p50 {pct(lat, .5):.1f} ms, "
              f"p99 {pct(lat, .99):.1f} ms, errors {err}")

        lat, err = await closed_loop(add, singles, callers, seconds)
        peak = len(lat) / seconds
        print(f"Add, {callers} callers: peak {peak:,.0f} calls/s, p50 {pct(lat, .5):.1f} ms, "
              f"p99 {pct(lat, .99):.1f} ms, errors {err}")

        for name, call in (("Add", add), ("Get", get)):
            lat, err = await open_loop(call, singles, peak / 2, seconds)
            print(f"{name} at half of peak ({peak / 2:,.0f}/s): p50 {pct(lat, .5):.2f} ms, "
                  f"p99 {pct(lat, .99):.2f} ms, mean {statistics.fmean(lat) * 1000:.2f} ms, "
                  f"errors {err}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    parser.add_argument("--callers", type=int, default=100)
    args = parser.parse_args()
    log_dir = workdir("counters")
    redis = start_redis(log_dir)
    config = write_config(log_dir / "config")
    rls = start_rls(config, log_dir, redis.url)
    try:
        asyncio.run(run(rls.grpc_addr, args.seconds, args.callers))
    finally:
        rls.stop()
        redis.stop()


if __name__ == "__main__":
    main()
