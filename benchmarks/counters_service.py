"""Counters service throughput and latency (issue 17): `rls.counters.v1` over gRPC on Redis.

Starts its own redis-server and one `rls serve` process (free loopback ports) and measures,
with h2load as the load generator (a C client, so the 2 shared cores go to rls and Redis, not
to a Python client):
1. BatchAdd of 30 items, 100 concurrent calls (h2load -c 4 -m 25, closed loop): items/s and
   per-batch p50/p99;
2. single Add, 100 concurrent calls (closed loop): the peak calls/s;
3. single Add, then single Get, at half that peak in a steady open loop (`_common.paced`:
   latency from each call's scheduled start, so queueing is never hidden; h2load's `--rps`
   sends in bursts, see `paced`): p50/p99 per call; a point that falls short of the offered
   rate by more than 5 % is marked `saturated`.
Every call must succeed (h2load: HTTP 200 for every request; the server's own counters
`rls_counters_requests_total` by code, scraped before and after, show no error).

    python benchmarks/counters_service.py [--seconds 8]

Targets (issue 17): >= 20,000 items/s per process in batches of 30, p99 < 50 ms at 100
callers; single Add/Get p99 < 5 ms at half of peak.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import (
    RlsProc,
    h2load,
    latency_stats,
    paced,
    start_redis,
    start_rls,
    workdir,
    write_config,
    write_frame,
    write_results,
)

from rls.frequency.proto import counters_pb2 as pb

SERVICE = "/rls.counters.v1.Counters/"
KEYS = 10_000


def item(i: int) -> pb.CounterRequest:
    return pb.CounterRequest(domain="ads", key=f"user:{i}:impressions", time_span=1,
                             time_unit=pb.DAY, hits=1)


def body_file(d: Path, name: str, message: bytes) -> Path:
    return write_frame(d / f"{name}.bin", message)


def counter_errors(rls: RlsProc) -> float:
    """Counter items the server did not answer fresh from the store: failed writes and reads
    (`unavailable`) and reads answered from the last known value (`stale`)."""
    return sum(v for (name, labels), v in rls.metrics().items()
               if name == "rls_counters_items_total" and dict(labels).get("code") != "ok")


def measure(rls: RlsProc, seconds: float, callers: int, d: Path,
            rate: float | None = None) -> dict[str, Any]:
    rnd = random.Random(1)
    batch = body_file(d, "batch", pb.BatchRequest(
        items=[item(rnd.randrange(KEYS)) for _ in range(30)]).SerializeToString())
    add = body_file(d, "add", item(7).SerializeToString())
    singles = [item(i).SerializeToString() for i in range(KEYS)]
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
    offered = rate or peak / 2
    for name in ("Add", "Get"):
        res = paced(rls.grpc_addr, SERVICE + name, singles, offered, seconds,
                    label=f"{name} at half")
        lat = latency_stats(res.latencies_us)
        saturated = res.achieved_rps < 0.95 * offered or res.errors > 0
        results[f"{name.lower()}_half"] = {"offered": offered, "achieved": res.achieved_rps,
                                           "errors": res.errors, "saturated": saturated, **lat}
        print(f"{name} at {'half of peak' if rate is None else 'a fixed rate'} "
              f"({offered:,.0f}/s offered, {res.achieved_rps:,.0f}/s "
              f"achieved{', SATURATED' if saturated else ''}, errors {res.errors}): "
              f"p50 {lat['p50_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms, "
              f"mean {lat['mean_ms']:.2f} ms", flush=True)
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
    parser.add_argument("--rate", type=float, default=None,
                        help="calls/s offered in the paced Add and Get phases (default: half "
                        "the Add peak; a fixed rate lets two revisions be compared at the same "
                        "offered load)")
    args = parser.parse_args()
    log_dir = workdir("counters")
    redis = start_redis(log_dir)
    config = write_config(log_dir / "config")
    rls = start_rls(config, log_dir, redis.url)
    try:
        results = measure(rls, args.seconds, args.callers, log_dir, args.rate)
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
