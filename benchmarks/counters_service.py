"""Counters service throughput and latency (issue 17): `rls.counters.v1` over gRPC on Redis.

Starts its own redis-server and one `rls serve` process (free loopback ports) and measures,
with h2load as the load generator (a C client, so the 2 shared cores go to rls and Redis, not
to a Python client):
1. BatchAdd of 30 items, 100 concurrent calls (h2load -c 4 -m 25, closed loop): items/s and
   per-batch p50/p99;
2. single Add, 100 concurrent calls (closed loop): the peak calls/s;
3. single Add, then single Get, paced at half that peak (h2load --rps over 4 connections):
   p50/p99 per call. h2load counts latency from each request's send, so a point whose achieved
   rate falls short of the offered one by more than 5 % is marked `saturated`;
4. the same paced Add/Get from a Python grpc.aio client in open loop (latency from each call's
   scheduled start, so queueing is never hidden) as a cross-check of 3.
Every call must succeed (h2load: HTTP 200 for every request; the server's own counters
`rls_counters_requests_total` by code, scraped before and after, show no error).

    python benchmarks/counters_service.py [--seconds 8]

Targets (issue 17): >= 20,000 items/s per process in batches of 30, p99 < 50 ms at 100
callers; single Add/Get p99 < 5 ms at half of peak.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import (
    RlsProc,
    h2load,
    latency_stats,
    start_redis,
    start_rls,
    workdir,
    write_config,
    write_frame,
    write_results,
)

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


async def python_open_loop(addr: str, seconds: float, rate: float) -> dict[str, float]:
    """Add then Get at `rate`/s from grpc.aio, latency from each call's scheduled start."""
    out: dict[str, float] = {}
    async with grpc.aio.insecure_channel(addr) as channel:
        singles = [item(i).SerializeToString() for i in range(KEYS)]
        for name in ("Add", "Get"):
            call = channel.unary_unary(SERVICE + name)
            lat, err = await open_loop(call, singles, rate, seconds)
            out[f"{name} p50 ms"], out[f"{name} p99 ms"] = pct(lat, .5), pct(lat, .99)
            out[f"{name} errors"] = err
    return out


def body_file(d: Path, name: str, message: bytes) -> Path:
    return write_frame(d / f"{name}.bin", message)


def counter_errors(rls: RlsProc) -> float:
    """Counter items the server did not answer fresh from the store: failed writes and reads
    (`unavailable`) and reads answered from the last known value (`stale`)."""
    return sum(v for (name, labels), v in rls.metrics().items()
               if name == "rls_counters_items_total" and dict(labels).get("code") != "ok")


def measure(rls: RlsProc, seconds: float, callers: int, d: Path) -> dict[str, Any]:
    rnd = random.Random(1)
    batch = body_file(d, "batch", pb.BatchRequest(
        items=[item(rnd.randrange(KEYS)) for _ in range(30)]).SerializeToString())
    add = body_file(d, "add", item(7).SerializeToString())
    get = body_file(d, "get", item(7).SerializeToString())
    url = f"http://127.0.0.1:{rls.grpc_port}{SERVICE}"
    clients, streams = 4, max(1, callers // 4)
    results: dict[str, Any] = {}
    errors_before = counter_errors(rls)
    h2load(url + "BatchAdd", batch, clients=clients, streams=streams, duration=1.0,
           log_dir=d).check()  # warm-up
    res = h2load(url + "BatchAdd", batch, clients=clients, streams=streams, duration=seconds,
                 label="BatchAdd x30", log_dir=d)
    res.check()
    lat = latency_stats(res.latencies_us)
    results["batch"] = {"items_per_s": res.rps * 30, "batches_per_s": res.rps, **lat}
    print(f"BatchAdd x30, {clients * streams} concurrent: {res.rps * 30:,.0f} items/s "
          f"({res.rps:,.0f} batches/s), p50 {lat['p50_ms']:.1f} ms, "
          f"p99 {lat['p99_ms']:.1f} ms", flush=True)
    res = h2load(url + "Add", add, clients=clients, streams=streams, duration=seconds,
                 label="Add peak", log_dir=d)
    res.check()
    peak = res.rps
    lat = latency_stats(res.latencies_us)
    results["add_peak"] = {"calls_per_s": peak, **lat}
    print(f"Add, {clients * streams} concurrent: peak {peak:,.0f} calls/s, "
          f"p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms", flush=True)
    for name, body in (("Add", add), ("Get", get)):
        res = h2load(url + name, body, clients=4, streams=64, duration=seconds,
                     rps_per_client=max(1.0, peak / 2 / 4), label=f"{name} at half", log_dir=d)
        res.check()
        lat = latency_stats(res.latencies_us)
        saturated = res.rps < 0.95 * peak / 2
        results[f"{name.lower()}_half"] = {"offered": peak / 2, "achieved": res.rps,
                                           "saturated": saturated, **lat}
        print(f"{name} at half of peak ({peak / 2:,.0f}/s offered, {res.rps:,.0f}/s achieved"
              f"{', SATURATED' if saturated else ''}): p50 {lat['p50_ms']:.2f} ms, "
              f"p99 {lat['p99_ms']:.2f} ms, mean {lat['mean_ms']:.2f} ms", flush=True)
    cross = asyncio.run(python_open_loop(rls.grpc_addr, seconds, peak / 2))
    results["python_open_loop"] = cross
    print("cross-check, Python open loop at half of peak: " + ", ".join(
        f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in cross.items()),
        flush=True)
    results["server_errors"] = counter_errors(rls) - errors_before
    print(f"calls the server answered with an error: {results['server_errors']:g}")
    return results


def verdicts(r: dict[str, Any]) -> list[tuple[str, float, bool]]:
    return [
        ("BatchAdd items/s >= 20,000", r["batch"]["items_per_s"],
         r["batch"]["items_per_s"] >= 20_000),
        ("BatchAdd p99 ms < 50 at 100 concurrent", r["batch"]["p99_ms"],
         r["batch"]["p99_ms"] < 50),
        ("Add p99 ms < 5 at half of peak", r["add_half"]["p99_ms"],
         r["add_half"]["p99_ms"] < 5 and not r["add_half"]["saturated"]),
        ("Get p99 ms < 5 at half of peak", r["get_half"]["p99_ms"],
         r["get_half"]["p99_ms"] < 5 and not r["get_half"]["saturated"]),
    ]


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
        results = measure(rls, args.seconds, args.callers, log_dir)
        checks = verdicts(results)
        print("\nperformance targets")
        for what, value, ok in checks:
            print(f"{'PASS' if ok and not results['server_errors'] else 'FAIL'}  {what}: "
                  f"{value:,.2f}")
        write_results("counters_service", {"results": results, "targets": [
            {"target": w, "measured": v, "pass": ok} for w, v, ok in checks]}, quick=False)
    finally:
        rls.stop()
        redis.stop()


if __name__ == "__main__":
    main()
