"""RLS throughput and latency with h2load: floor (empty grpc.aio handler), rls memory, rls Redis.

All three servers run in the same run on the same machine; rounds are interleaved (the order
rotates each round) so machine noise hits every target alike. Throughput is h2load's req/s,
median over rounds; ratios are rls / floor (DESIGN §11: >= 0.8 memory, >= 0.7 Redis).

Request: the 3-descriptor request Envoy sends for `GET /items?page=1` (user+path, api+user,
remote_address). Variants: `allowed` (limits never reached) and `over` (remote_address allows 1
per hour, so every call after the first is OVER_LIMIT; nothing is charged).

Success check: one python gRPC call per target before the run (grpc-status 0, expected
overall_code), h2load's counts (every request done with HTTP 200, none failed/errored), and for
rls the server's own counters: rls_requests_total grows by h2load's request count (plus at most
the calls in flight at h2load's deadline) with the expected code, and neither
rls_request_errors_total (a gRPC error) nor rls_backend_errors_total (a Redis call that missed
its deadline and was answered by the failure mode instead of Redis) grows; a run where they
do is repeated once, and if it happens again it is kept and its count shown in the `errors`
column (its req/s then includes fail-open answers). A count mismatch stops the script.
The Redis server runs with --backend-timeout-ms 1000 so that a saturated server still decides
every call in Redis (its 15 ms default would turn queueing at saturation into fail-open
answers, which are not decisions).

    python benchmarks/rls_throughput.py [--quick] [--rounds 3] [--duration 4]
"""

from __future__ import annotations

import argparse
from typing import Any

from _common import (
    METHOD,
    H2Result,
    check_grpc_ok,
    h2load,
    latency_stats,
    median,
    metric_sum,
    request_bytes,
    start_floor,
    start_redis,
    start_rls,
    table,
    verify_rls_run,
    workdir,
    write_config,
    write_frame,
    write_results,
)

OK, OVER = 1, 2
DOMAIN = {"allowed": "bench", "over": "bench_over"}


def measured_run(target: dict[str, Any], variant: str, args: argparse.Namespace,
                 log_dir: Any) -> H2Result:
    """One h2load run, verified; a run with errors is repeated once, then kept and flagged."""
    url = f"http://127.0.0.1:{target['port']}{METHOD}"
    rls = target.get("rls")
    for attempt in (1, 2):
        before = rls.metrics() if rls else None
        res = h2load(url, target["bodies"][variant], clients=args.clients,
                     streams=args.streams, duration=args.duration,
                     label=f"{target['name']}/{variant}", log_dir=log_dir)
        res.check()
        if rls is None:
            return res
        # h2load -D stops counting at the deadline: up to clients x streams calls still in
        # flight then are answered (and counted by rls) but not by h2load.
        after, errors = verify_rls_run(
            rls, before, res.total, args.clients * args.streams, res.label,
            domain=DOMAIN[variant], code="OK" if variant == "allowed" else "OVER_LIMIT")
        if not errors:
            break
        print(f"{res.label}: {errors:.0f} gRPC/backend errors (fail-open answers) during "
              f"the run{'; repeating it' if attempt == 1 else '; kept and flagged'}", flush=True)
    target.setdefault("errors", {}).setdefault(variant, []).append(errors)
    trips = (metric_sum(after, "rls_backend_roundtrips_total")
             - metric_sum(before, "rls_backend_roundtrips_total"))
    target.setdefault("trips", {}).setdefault(variant, []).append(trips / res.total)
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few seconds: smoke test")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per h2load run")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up per server")
    parser.add_argument("--clients", type=int, default=2, help="h2load -c (connections)")
    parser.add_argument("--streams", type=int, default=16, help="h2load -m (streams/connection)")
    parser.add_argument("--backend-timeout-ms", type=int, default=1000,
                        help="rls --backend-timeout-ms for the Redis server (see README)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.duration, args.warmup = 1, 1.0, 0.5

    d = workdir("throughput")
    cfg = write_config(d / "config")
    redis = start_redis(d)
    floor = start_floor(d)
    mem = start_rls(cfg, d, name="rls-memory")
    red = start_rls(cfg, d, redis_url=redis.url, name="rls-redis",
                    extra=["--backend-timeout-ms", str(args.backend_timeout_ms)])

    allowed, over = request_bytes("bench"), request_bytes("bench_over")
    bodies = {"allowed": write_frame(d / "allowed.bin", allowed),
              "over": write_frame(d / "over.bin", over)}
    targets = [
        {"name": "floor", "port": floor.grpc_port, "bodies": bodies, "variants": ["allowed"]},
        {"name": "rls memory", "port": mem.grpc_port, "bodies": bodies, "rls": mem,
         "variants": ["allowed", "over"]},
        {"name": "rls redis", "port": red.grpc_port, "bodies": bodies, "rls": red,
         "variants": ["allowed", "over"]},
    ]

    # One real gRPC call per target and variant before the run (grpc-status 0, right code).
    check_grpc_ok(floor.grpc_addr, allowed, OK)
    for rls in (mem, red):
        check_grpc_ok(rls.grpc_addr, allowed, OK)
        check_grpc_ok(rls.grpc_addr, over)  # the first call of the hour may pass
        check_grpc_ok(rls.grpc_addr, over, OVER)

    for t in targets:  # warm-up (not measured)
        for v in t["variants"]:
            h2load(f"http://127.0.0.1:{t['port']}{METHOD}", bodies[v], clients=args.clients,
                   streams=args.streams, duration=args.warmup, log_dir=d).check()

    runs: dict[tuple[str, str], list[H2Result]] = {}
    order = [(t, v) for t in targets for v in t["variants"]]
    for r in range(args.rounds):
        rotated = order[r % len(order):] + order[: r % len(order)]
        for t, v in rotated:
            res = measured_run(t, v, args, d)
            runs.setdefault((t["name"], v), []).append(res)
            print(f"round {r + 1}: {res.label:<20} {res.rps:9.1f} req/s", flush=True)

    floor_rps = median([x.rps for x in runs[("floor", "allowed")]])
    rows, out = [], []
    for t, v in order:
        rs = runs[(t["name"], v)]
        rps = median([x.rps for x in rs])
        lat = latency_stats([us for x in rs for us in x.latencies_us])
        trips = t.get("trips", {}).get(v)
        errors = t.get("errors", {}).get(v)
        entry = {
            "target": t["name"], "variant": v, "rps_median": round(rps, 1),
            "rps_rounds": [round(x.rps, 1) for x in rs],
            "ratio_to_floor": round(rps / floor_rps, 3),
            "requests": sum(x.total for x in rs), "latency": lat,
            "backend_roundtrips_per_call": None if trips is None else round(median(trips), 3),
            "errors_in_kept_runs": None if errors is None else sum(errors),
            "h2load": [x.summary() for x in rs],
        }
        out.append(entry)
        rows.append([t["name"], v, rps, " ".join(f"{x.rps:.0f}" for x in rs),
                     f"{rps / floor_rps:.2f}", lat.get("mean_ms"), lat.get("p50_ms"),
                     lat.get("p99_ms"), lat.get("p999_ms"),
                     "-" if trips is None else f"{median(trips):.2f}",
                     "-" if errors is None else int(sum(errors))])
    title = (f"RLS throughput: h2load -c {args.clients} -m {args.streams}, {args.duration:g} s x "
             f"{args.rounds} round(s), 3-descriptor request")
    text = table(["target", "variant", "req/s (median)", "rounds", "x floor", "mean ms",
                  "p50 ms", "p99 ms", "p99.9 ms", "redis trips/call", "errors"], rows, title)
    ratios = {f"{e['target']}/{e['variant']}": e["ratio_to_floor"] for e in out
              if e["target"] != "floor"}
    print("\nDESIGN §11 targets: memory >= 0.80 x floor, redis >= 0.70 x floor")
    write_results("rls_throughput", {
        "params": vars(args), "results": out, "ratios_to_floor": ratios,
        "targets": {"memory_ratio_min": 0.8, "redis_ratio_min": 0.7},
    }, args.quick, [text])
    for p in (mem, red, floor, redis):
        p.stop()


if __name__ == "__main__":
    main()
