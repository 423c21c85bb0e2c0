"""RLS throughput and latency with h2load: floor (empty grpc.aio handler), rls memory, rls Redis.

All three servers run in the same run on the same machine; rounds are interleaved (the order
rotates each round) so machine noise hits every target alike. Throughput is h2load's req/s,
median over rounds; ratios are rls / floor (targets: >= 0.95 memory, >= 0.80 Redis, with 0
failure-mode answers).

Request: the 3-descriptor request Envoy sends for `GET /items?page=1` (user+path, api+user,
remote_address). Variants: `allowed` (limits never reached) and `over` (remote_address allows 1
per hour, so every call after the first is OVER_LIMIT; nothing is charged).

Success check: one python gRPC call per target before the run (grpc-status 0, expected
overall_code), h2load's counts (every request done with HTTP 200, none failed/errored), and for
rls the server's own counters: rls_requests_total grows by h2load's request count (plus at most
the calls in flight at h2load's deadline) with the expected code. Every rls figure carries the
calls answered by the failure mode in its measured runs (rls_failure_mode_answers_total +
rls_request_errors_total, scraped before and after each run): a figure with any is marked
INVALID (its req/s counts answers that are not decisions) and fails its target. Runs are not
repeated to get a clean one. rls runs with its production defaults (no --backend-timeout-ms
unless given here).

    python benchmarks/rls_throughput.py [--quick] [--rounds 3] [--duration 4]
"""

from __future__ import annotations

import argparse
from typing import Any

from _common import (
    METHOD,
    NO_FAILURE_ANSWERS,
    FailureModeAnswers,
    H2Result,
    check_grpc_ok,
    h2load,
    latency_stats,
    median,
    metric_sum,
    print_targets,
    process_cpu_s,
    request_bytes,
    start_floor,
    start_redis,
    start_rls,
    table,
    target_result,
    validity,
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
    """One h2load run, verified; its failure-mode answers are added to the target's figure."""
    url = f"http://127.0.0.1:{target['port']}{METHOD}"
    rls = target.get("rls")
    before = rls.metrics() if rls else None
    pid = target["proc"].proc.pid
    cpu_before = process_cpu_s(pid)
    res = h2load(url, target["bodies"][variant], clients=args.clients,
                 streams=args.streams, duration=args.duration,
                 label=f"{target['name']}/{variant}", log_dir=log_dir)
    res.check()
    # The server's own CPU per call (all its threads: grpc's poller included), h2load's aside.
    cpu_us = (process_cpu_s(pid) - cpu_before) * 1e6 / max(res.total, 1)
    target.setdefault("cpu", {}).setdefault(variant, []).append(cpu_us)
    if rls is None:
        return res
    # h2load -D stops counting at the deadline: up to clients x streams calls still in
    # flight then are answered (and counted by rls) but not by h2load.
    after, fm = verify_rls_run(
        rls, before, res.total, args.clients * args.streams, res.label,
        domain=DOMAIN[variant], code="OK" if variant == "allowed" else "OVER_LIMIT")
    if not fm.valid:
        print(f"{res.label}: {fm.count} calls answered by the failure mode {fm.breakdown}: "
              "this figure is INVALID", flush=True)
    kept: dict[str, FailureModeAnswers] = target.setdefault("fm", {})
    kept[variant] = kept.get(variant, NO_FAILURE_ANSWERS) + fm
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
    parser.add_argument("--rls-arg", action="append", default=[], metavar="ARG",
                        help="extra `rls serve` argument for both rls servers, repeatable "
                             "(e.g. --rls-arg=--backend-timeout-ms=100); default: none, "
                             "production defaults")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.duration, args.warmup = 1, 1.0, 0.5

    d = workdir("throughput")
    cfg = write_config(d / "config")
    redis = start_redis(d)
    floor = start_floor(d)
    mem = start_rls(cfg, d, name="rls-memory", extra=args.rls_arg)
    red = start_rls(cfg, d, redis_url=redis.url, name="rls-redis", extra=args.rls_arg)

    allowed, over = request_bytes("bench"), request_bytes("bench_over")
    bodies = {"allowed": write_frame(d / "allowed.bin", allowed),
              "over": write_frame(d / "over.bin", over)}
    targets = [
        {"name": "floor", "port": floor.grpc_port, "bodies": bodies, "proc": floor,
         "variants": ["allowed"]},
        {"name": "rls memory", "port": mem.grpc_port, "bodies": bodies, "rls": mem, "proc": mem,
         "variants": ["allowed", "over"]},
        {"name": "rls redis", "port": red.grpc_port, "bodies": bodies, "rls": red, "proc": red,
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
    rows, out, targets = [], [], []
    goal = {"rls memory": 0.95, "rls redis": 0.80}
    for t, v in order:
        rs = runs[(t["name"], v)]
        rps = median([x.rps for x in rs])
        lat = latency_stats([us for x in rs for us in x.latencies_us])
        trips = t.get("trips", {}).get(v)
        cpu_us = median(t["cpu"][v])
        fm: FailureModeAnswers | None = t.get("fm", {}).get(v) if "rls" in t else None
        entry = {
            "target": t["name"], "variant": v, "rps_median": round(rps, 1),
            "rps_rounds": [round(x.rps, 1) for x in rs],
            "ratio_to_floor": round(rps / floor_rps, 3),
            "requests": sum(x.total for x in rs), "latency": lat,
            "server_cpu_us_per_call": round(cpu_us, 1),
            "backend_roundtrips_per_call": None if trips is None else round(median(trips), 3),
            **(fm.json() if fm is not None else {"failure_mode_answers": None, "valid": True}),
            "h2load": [x.summary() for x in rs],
        }
        out.append(entry)
        rows.append([t["name"], v, rps, " ".join(f"{x.rps:.0f}" for x in rs),
                     f"{rps / floor_rps:.2f}", f"{cpu_us:.0f}", lat.get("mean_ms"),
                     lat.get("p50_ms"),
                     lat.get("p99_ms"), lat.get("p999_ms"),
                     "-" if trips is None else f"{median(trips):.2f}",
                     "-" if fm is None else fm.count, validity(fm)])
        if t["name"] in goal:
            ratio = rps / floor_rps
            targets.append(target_result(
                f"{t['name']}/{v} >= {goal[t['name']]:.2f} x floor", round(ratio, 3),
                ratio >= goal[t["name"]], fm))
    title = (f"RLS throughput: h2load -c {args.clients} -m {args.streams}, {args.duration:g} s x "
             f"{args.rounds} round(s), 3-descriptor request")
    text = table(["target", "variant", "req/s (median)", "rounds", "x floor",
                  "server CPU µs/call", "mean ms",
                  "p50 ms", "p99 ms", "p99.9 ms", "redis trips/call", "failure-mode answers",
                  "valid"], rows, title)
    ratios = {f"{e['target']}/{e['variant']}": e["ratio_to_floor"] for e in out
              if e["target"] != "floor"}
    text2 = print_targets(targets)
    write_results("rls_throughput", {
        "params": vars(args), "results": out, "ratios_to_floor": ratios,
        "targets": {"memory_ratio_min": 0.95, "redis_ratio_min": 0.80,
                    "failure_mode_answers_max": 0},
        "target_results": targets,
    }, args.quick, [text, text2])
    for p in (mem, red, floor, redis):
        p.stop()


if __name__ == "__main__":
    main()
