"""Accuracy of leased counters (`--redis-leases`): two rls processes on one Redis, two callers
each, one limit, demand three times the limit, for five windows.

Each caller sends ShouldRateLimit calls for one tenant (hits 1-5 each, request-level
hits_addend) paced so that the four callers together ask for 3x the limit per window. Reported
per window (one-second epoch windows, the limit `--limit` hits per second):
- the window's Redis counter (every token dealt in it, handed out or stranded in a lease): it
  must never exceed the limit;
- the hits admitted, by the window holding each call (the midpoint of send and receive; calls
  whose send and receive straddle a window's edge are counted apart as `straddling`): at most
  the limit, and at least 0.98x the limit;
- Redis commands per decision (INFO commandstats), the lease counts of both processes
  (decisions, refills, stranded tokens), and the calls the failure mode answered (a run with
  any is INVALID).
The same run without leases (every decision one Redis call) is printed beside it.

    python benchmarks/lease_accuracy.py [--limit 600] [--windows 5] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Any

from _common import (
    failure_mode_answers,
    start_redis,
    start_rls,
    workdir,
    write_config,
    write_results,
)

DOMAIN = "lease"
TENANT = "acme"
CALLERS_PER_PROCESS = 2
MEAN_HITS = 3  # hits 1-5, uniform


def config_text(limit: int) -> str:
    return f"""
domain: {DOMAIN}
descriptors:
  - key: tenant
    rate_limit: {{unit: second, requests_per_unit: {limit}}}
"""


def redis_commands(client: Any) -> int:
    stats = client.info("commandstats")
    # Not decisions: the benchmark's own reads (SCAN, GET of the counters) and housekeeping.
    # (The counters' GETs are left out with the scripts' GETs: lua/lease.lua reads with GET.)
    ignored = {"cmdstat_info", "cmdstat_ping", "cmdstat_script", "cmdstat_client",
               "cmdstat_hello", "cmdstat_time", "cmdstat_select", "cmdstat_command",
               "cmdstat_scan", "cmdstat_get", "cmdstat_keys", "cmdstat_config"}
    return sum(int(v["calls"]) for k, v in stats.items()
               if k.startswith("cmdstat_") and k not in ignored)


async def caller(addr: str, rate: float, until: float, seed: int,
                 calls: list[tuple[float, float, int, bool]]) -> None:
    """Paced calls until `until` (wall clock): (sent s, received s, hits, admitted) each."""
    import grpc
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

    rng = random.Random(seed)
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        interval = 1.0 / rate
        next_at = time.time()
        while True:
            now = time.time()
            if now >= until:
                return
            if next_at > now:
                await asyncio.sleep(next_at - now)
            next_at += interval
            hits = rng.randint(1, 5)
            req = rls_pb2.RateLimitRequest(domain=DOMAIN, hits_addend=hits)
            req.descriptors.add().entries.add(key="tenant", value=TENANT)
            sent = time.time()
            resp = await stub.ShouldRateLimit(req, timeout=2.0)
            calls.append((sent, time.time(), hits, resp.overall_code == 1))


def run_mode(leases: bool, args: argparse.Namespace) -> dict[str, Any]:
    log_dir = workdir("lease-accuracy")
    config = write_config(log_dir / "config", config_text(args.limit))
    redis = start_redis(log_dir)
    procs = []
    try:
        extra = ["--backend-timeout-ms", "1000"]
        if leases:
            extra += ["--redis-leases", "on"]
        procs = [start_rls(config, log_dir, redis.url, extra, name=f"rls{i}") for i in range(2)]
        client = redis.client()
        client.flushall()
        before = [p.metrics() for p in procs]
        commands_before = redis_commands(client)
        callers = CALLERS_PER_PROCESS * len(procs)
        rate = 3 * args.limit / MEAN_HITS / callers  # calls per second per caller
        start = float(int(time.time()) + 1)  # a window's start
        until = start + args.windows + 0.999
        calls: list[tuple[float, float, int, bool]] = []

        counters: dict[int, int] = {}  # window -> the highest its counter was seen

        def read_counters() -> None:
            for key in client.scan_iter(match=f"*{DOMAIN}|tenant|{TENANT}*"):
                name = key.decode()
                if name.endswith("!lease") or "@" not in name:
                    continue
                window = int(name.rsplit("@", 1)[1])
                counters[window] = max(counters.get(window, 0), int(client.get(key) or 0))

        async def watch() -> None:
            # A one-second window's key lives a second past its end (GRACE_MS): read often.
            while time.time() < until + 0.5:
                await asyncio.to_thread(read_counters)
                await asyncio.sleep(0.2)

        async def drive() -> None:
            await asyncio.sleep(max(0.0, start - time.time() - 0.2))  # a little before
            await asyncio.gather(watch(), *(
                caller(p.grpc_addr, rate, until, seed=10 * i + j, calls=calls)
                for i, p in enumerate(procs) for j in range(CALLERS_PER_PROCESS)
            ))

        asyncio.run(drive())
        commands = redis_commands(client) - commands_before
        after = [p.metrics_after("rls_requests_total", 0) for p in procs]
        failures = [failure_mode_answers(b, a) for b, a in zip(before, after, strict=True)]
    finally:
        for p in procs:
            p.stop()
        redis.stop()

    windows = []
    for w in range(int(start), int(start) + args.windows):
        admitted = straddling = 0
        for sent, received, hits, ok in calls:
            if not ok:
                continue
            if int(sent) != int(received) and int(sent) <= w <= int(received):
                straddling += hits
            elif int((sent + received) / 2) == w:
                admitted += hits
        windows.append({"window": w, "redis_counter": counters.get(w, 0),
                        "admitted_hits": admitted, "straddling_hits": straddling,
                        "asked_hits": sum(h for s, r, h, _ in calls if int((s + r) / 2) == w)})
    lease_counts = {
        name: sum(a.get((f"rls_lease_{name}_total", ()), 0.0) for a in after)
        for name in ("decisions", "refills", "releases", "released_tokens", "stranded_tokens",
                     "lost")
    }
    return {
        "mode": "leases" if leases else "per call",
        "limit": args.limit,
        "windows": windows,
        "calls": len(calls),
        "redis_commands_per_decision": commands / max(len(calls), 1),
        "lease_counts": lease_counts,
        "failure_mode_answers": sum(f.count for f in failures),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=600, help="hits per one-second window")
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.windows = 2
    rows = [run_mode(True, args), run_mode(False, args)]
    for row in rows:
        limit = row["limit"]
        print(f"\n{row['mode']}: limit {limit} hits/s, {row['calls']} calls, "
              f"{row['redis_commands_per_decision']:.3f} Redis commands per decision, "
              f"failure-mode answers {row['failure_mode_answers']}"
              + ("  INVALID" if row["failure_mode_answers"] else ""))
        if row["mode"] == "leases":
            print("  lease counts (both processes): " + ", ".join(
                f"{k} {v:.0f}" for k, v in row["lease_counts"].items()))
        print(f"  {'window':>12} {'asked':>7} {'counter':>8} {'admitted':>9} {'straddling':>11} "
              f"{'admitted/limit':>15} {'<= limit':>9}")
        for w in row["windows"]:
            share = (w["admitted_hits"] + w["straddling_hits"]) / limit
            within = w["redis_counter"] <= limit and w["admitted_hits"] <= limit
            print(f"  {w['window']:>12} {w['asked_hits']:>7} {w['redis_counter']:>8} "
                  f"{w['admitted_hits']:>9} {w['straddling_hits']:>11} {share:>15.3f} "
                  f"{'yes' if within else 'NO':>9}")
    write_results("lease_accuracy", {"rows": rows}, args.quick)


if __name__ == "__main__":
    main()
