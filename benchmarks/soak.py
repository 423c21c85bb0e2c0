"""Soak: a few minutes of mixed load against rls + Redis; memory growth and error counts.

rls runs with its production defaults (Redis backend; `--rls-arg` adds `rls serve` arguments)
on a private redis-server. The load generator (this process, grpc.aio, `--tasks` concurrent
callers, paced to `--rate` calls/s when given) sends each call with a gRPC deadline of
`--call-timeout` seconds (default 0.25 s, the rate-limit filter timeout of envoy/gateway.yaml,
which Envoy sends as grpc-timeout; rls takes its store-time budget from it) and a mix of:

- allowed (45 %): domain bench, 3 descriptors, user among 50,000 ids -> OK;
- over (15 %): domain bench_over (remote_address 1/hour) -> OVER_LIMIT;
- mixed (20 %): domain soak, token bucket 10/min per user (200 users) and a sliding window
  per ip (200 ips) -> OK or OVER_LIMIT;
- unknown (5 %): a domain that is not configured -> OK;
- invalid (15 %): empty domain / no descriptors / empty key / undecodable bytes
  -> INVALID_ARGUMENT.

Every few seconds it samples the rls process's RSS (psutil; all worker processes if any) and
Redis used_memory. Reported: RSS first third vs last third of the run (growth), calls by kind
and outcome, unexpected outcomes (errors), rls's own error counters and the warnings in its log,
and the calls answered by the failure mode (rls_failure_mode_answers_total +
rls_request_errors_total other than the invalid requests sent on purpose, scraped before and
after the run): with any, the run's calls/s figure is marked INVALID.

    python benchmarks/soak.py [--minutes 2] [--quick] [--tasks 8] [--rate 0]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from typing import Any

from _common import (
    BENCH_CONFIG,
    DESCRIPTORS,
    METHOD,
    OVER_CONFIG,
    check_grpc_ok,
    failure_mode_answers,
    metric_sum,
    request_bytes,
    start_redis,
    start_rls,
    table,
    workdir,
    write_config,
    write_results,
)

SOAK_CONFIG = """\
domain: soak
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: token_bucket, burst: 10}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 50, algorithm: sliding_window}
"""

MIX = (("allowed", 45), ("over", 15), ("mixed", 20), ("unknown", 5), ("invalid", 15))
OK, OVER = 1, 2


def make_request(kind: str, rnd: random.Random) -> bytes:
    if kind == "allowed":
        user = f"u{rnd.randrange(50_000)}"
        descs = [[(k, user if k == "user" else v) for k, v in e] for e in DESCRIPTORS]
        return request_bytes("bench", descs)
    if kind == "over":
        return request_bytes("bench_over")
    if kind == "mixed":
        user, ip = f"m{rnd.randrange(200)}", f"10.0.{rnd.randrange(4)}.{rnd.randrange(50)}"
        return request_bytes("soak", [[("user", user)], [("ip", ip)]])
    if kind == "unknown":
        return request_bytes(f"nosuch{rnd.randrange(5)}")
    choice = rnd.randrange(4)
    if choice == 0:
        return request_bytes("", DESCRIPTORS)  # empty domain
    if choice == 1:
        return request_bytes("bench", [])  # no descriptors
    if choice == 2:
        return request_bytes("bench", [[("", "x")]])  # empty key
    return b"\xff\xff\xff\xff"  # not a protobuf message


def expected(kind: str, status: str, code: int | None) -> bool:
    if kind == "invalid":
        return status == "INVALID_ARGUMENT"
    if status != "OK":
        return False
    return {"allowed": code == OK, "over": code == OVER, "mixed": code in (OK, OVER),
            "unknown": code == OK}[kind]


async def load(addr: str, seconds: float, tasks: int, rate: float, stats: dict[str, Any],
               seed: int, call_timeout: float) -> None:
    import grpc
    from envoy.service.ratelimit.v3 import rls_pb2

    kinds = [k for k, w in MIX for _ in range(w)]
    deadline = time.monotonic() + seconds
    interval = tasks / rate if rate > 0 else 0.0
    async with grpc.aio.insecure_channel(addr) as channel:
        call = channel.unary_unary(METHOD)

        async def worker(i: int) -> None:
            rnd = random.Random(seed * 1000 + i)
            next_at = time.monotonic()
            while time.monotonic() < deadline:
                if interval:
                    next_at += interval
                    delay = next_at - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                kind = rnd.choice(kinds)
                body = make_request(kind, rnd)
                code = None
                try:
                    data = await call(body, timeout=call_timeout)
                    status = "OK"
                    code = rls_pb2.RateLimitResponse.FromString(data).overall_code
                except grpc.aio.AioRpcError as exc:
                    status = exc.code().name
                outcome = status if status != "OK" else ("OK/" + {OK: "OK", OVER: "OVER_LIMIT"}
                                                         .get(code, str(code)))
                by_kind = stats["calls"].setdefault(kind, {})
                by_kind[outcome] = by_kind.get(outcome, 0) + 1
                if not expected(kind, status, code):
                    key = f"{kind}: {outcome}"
                    stats["unexpected"][key] = stats["unexpected"].get(key, 0) + 1

        await asyncio.gather(*(worker(i) for i in range(tasks)))


async def sample(pids: list[int], redis_client: Any, seconds: float, every: float,
                 samples: list[dict[str, Any]]) -> None:
    import psutil

    procs = [psutil.Process(p) for p in pids]
    t0 = time.monotonic()
    while True:
        t = time.monotonic() - t0
        rss = sum(p.memory_info().rss for p in procs)
        used = int(redis_client.info("memory")["used_memory"])
        samples.append({"t": round(t, 1), "rss_bytes": rss, "redis_used_memory": used})
        if t >= seconds:
            return
        await asyncio.sleep(min(every, max(0.0, seconds - t)))


def thirds(values: list[float]) -> tuple[float, float]:
    k = max(1, len(values) // 3)
    return statistics.fmean(values[:k]), statistics.fmean(values[-k:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=2.0, help="length of the soak")
    parser.add_argument("--quick", action="store_true", help="10 seconds: smoke test")
    parser.add_argument("--tasks", type=int, default=8, help="concurrent callers")
    parser.add_argument("--rate", type=float, default=0.0, help="calls/s in total (0 = flat out)")
    parser.add_argument("--sample-every", type=float, default=3.0, help="seconds between samples")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--call-timeout", type=float, default=0.25,
                        help="gRPC deadline per call, s (Envoy's filter timeout in the gateway)")
    parser.add_argument("--rls-arg", action="append", default=[], metavar="ARG",
                        help="extra `rls serve` argument, repeatable; default: none")
    args = parser.parse_args()
    if args.quick:
        args.minutes, args.sample_every = 10 / 60, 1.0
    seconds = args.minutes * 60

    import psutil

    d = workdir("soak")
    cfg = write_config(d / "config", BENCH_CONFIG, OVER_CONFIG, SOAK_CONFIG)
    redis = start_redis(d)
    rls = start_rls(cfg, d, redis_url=redis.url, name="rls-soak", extra=args.rls_arg)
    root = psutil.Process(rls.pid)
    pids = [p.pid for p in root.children(recursive=True)] or [rls.pid]
    check_grpc_ok(rls.grpc_addr, request_bytes("bench_over"))  # the hour's one allowed call
    check_grpc_ok(rls.grpc_addr, request_bytes("bench_over"), OVER)
    before = rls.metrics()

    stats: dict[str, Any] = {"calls": {}, "unexpected": {}}
    samples: list[dict[str, Any]] = []

    async def run() -> None:
        await asyncio.gather(
            load(rls.grpc_addr, seconds, args.tasks, args.rate, stats, args.seed,
                 args.call_timeout),
            sample(pids, redis.client(), seconds, args.sample_every, samples),
        )

    print(f"soak: {seconds:.0f} s of mixed load on rls pid {rls.pid}", flush=True)
    t0 = time.monotonic()
    asyncio.run(run())
    elapsed = time.monotonic() - t0
    after = rls.metrics()
    alive = rls.alive()
    log = rls.log()
    rls.stop()

    def delta(name: str, **labels: str) -> float:
        return metric_sum(after, name, **labels) - metric_sum(before, name, **labels)

    total = sum(sum(v.values()) for v in stats["calls"].values())
    rss = [s["rss_bytes"] / 2**20 for s in samples]
    first, last = thirds(rss)
    redis_mem = [s["redis_used_memory"] / 2**20 for s in samples]
    r_first, r_last = thirds(redis_mem)
    log_lines = log.splitlines()
    warnings = [ln for ln in log_lines if " WARNING " in ln or " ERROR " in ln
                or "Traceback" in ln]
    counters = {
        "rls_request_errors_total": delta("rls_request_errors_total"),
        "rls_failure_mode_answers_total": delta("rls_failure_mode_answers_total"),
        "rls_requests_total": delta("rls_requests_total"),
    }
    # The invalid requests are sent on purpose: INVALID_ARGUMENT is their expected answer.
    fm = failure_mode_answers(before, after, ignore_reasons=("invalid_argument",))
    # Calls the caller gave up on (its deadline passed first): Envoy would answer them with its
    # own failure mode, so they too make the figure invalid (counted apart: rls may have
    # answered them late, or by its failure mode, and counted them itself).
    gave_up = sum(outs.get("DEADLINE_EXCEEDED", 0) for outs in stats["calls"].values())
    valid = fm.valid and not gave_up
    unexpected = sum(stats["unexpected"].values())

    t1 = table(["metric", "value"], [
        ["duration s", round(elapsed, 1)],
        ["calls", total],
        ["calls/s", round(total / elapsed, 1)],
        ["calls answered by the failure mode (rls)", fm.count],
        ["calls the caller gave up on (DEADLINE_EXCEEDED)", gave_up],
        ["calls/s figure valid", "yes" if valid else "INVALID"],
        ["rls RSS first third MiB", round(first, 2)],
        ["rls RSS last third MiB", round(last, 2)],
        ["rls RSS growth MiB", round(last - first, 2)],
        ["rls RSS growth %", round((last - first) / first * 100, 2)],
        ["rls RSS max MiB", round(max(rss), 2)],
        ["redis used_memory first/last third MiB", f"{r_first:.2f} / {r_last:.2f}"],
        ["unexpected outcomes (errors)", unexpected],
        ["rls_request_errors_total (invalid + unavailable)", counters["rls_request_errors_total"]],
        ["rls log warnings/errors", len(warnings)],
        ["rls alive at the end", "yes" if alive else "NO"],
    ], f"Soak: {seconds:.0f} s, {args.tasks} tasks, "
       f"{'flat out' if not args.rate else f'{args.rate:g} calls/s'}, rls + Redis")
    print()
    rows = [[kind, outcome, n] for kind, outs in stats["calls"].items()
            for outcome, n in sorted(outs.items())]
    t2 = table(["kind", "outcome", "calls"], rows, "Calls by kind and outcome")
    if stats["unexpected"]:
        print("\nunexpected:", stats["unexpected"])
    if not fm.valid:
        print("\nfailure-mode answers:", fm.breakdown)
    write_results("soak", {
        "params": vars(args), "elapsed_s": elapsed, "calls_total": total,
        "calls_per_s": round(total / elapsed, 1), **fm.json(),
        "caller_deadline_exceeded": gave_up, "valid": valid,
        "calls": stats["calls"], "unexpected": stats["unexpected"],
        "rss_mib": {"first_third": first, "last_third": last, "growth": last - first,
                    "growth_pct": (last - first) / first * 100, "max": max(rss)},
        "redis_used_memory_mib": {"first_third": r_first, "last_third": r_last},
        "rls_counters": counters, "rls_log_warnings": warnings[:50],
        "rls_log_warning_count": len(warnings), "samples": samples, "rls_alive": alive,
    }, args.quick, [t1, t2])
    redis.stop()


if __name__ == "__main__":
    main()
