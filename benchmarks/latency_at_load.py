"""Latency at a fixed offered load: 1,000 calls/s and half of the measured peak.

For the floor (benchmarks/floor_server.py: the same grpc.aio server with an empty handler, so
the part of the latency that is grpc.aio itself), rls with the memory backend and rls with
Redis: first the peak (h2load closed loop, like
rls_throughput.py), then a steady open loop at each rate (`_common.paced`: call i starts at
i / rate, latency from that scheduled start; h2load's `--rps` sends in bursts, see `paced`).
Latency is per call: mean, p50, p99, p99.9. A point whose achieved rate falls short
of the offered one by more than 5 % is marked `saturated` (its latencies then measure queueing).

Every rls point (and each server's peak) carries the calls answered by the failure mode during
its run (rls_failure_mode_answers_total + rls_request_errors_total, scraped before and after):
a point with any is marked INVALID (a fail-open answer is fast and not a decision) and fails
its target. rls runs with its production defaults (`--rls-arg` adds `rls serve` arguments).

performance targets: p99 under 5 ms at half of peak; mean under 1 ms at 1,000 calls/s.

    python benchmarks/latency_at_load.py [--quick] [--duration 10] [--rates 1000,half]
"""

from __future__ import annotations

import argparse
from typing import Any

from _common import (
    METHOD,
    RlsProc,
    check_grpc_ok,
    failure_mode_answers,
    fm_cell,
    h2load,
    paced,
    print_targets,
    request_bytes,
    start_floor,
    start_redis,
    start_rls,
    table,
    target_result,
    validity,
    workdir,
    write_config,
    write_frame,
    write_results,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few seconds: smoke test")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per load point")
    parser.add_argument("--peak-duration", type=float, default=4.0)
    parser.add_argument("--rates", default="1000,half",
                        help="comma list of calls/s; 'half' = half of the measured peak")
    parser.add_argument("--rls-arg", action="append", default=[], metavar="ARG",
                        help="extra `rls serve` argument, repeatable; default: none")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.peak_duration = 2.0, 1.0

    d = workdir("latency")
    cfg = write_config(d / "config")
    redis = start_redis(d)
    servers = [("floor", start_floor(d)),
               ("rls memory", start_rls(cfg, d, name="rls-memory", extra=args.rls_arg)),
               ("rls redis", start_rls(cfg, d, redis_url=redis.url, name="rls-redis",
                                       extra=args.rls_arg))]
    req = request_bytes("bench")
    body = write_frame(d / "req.bin", req)

    rows, out, targets = [], [], []
    for name, rls in servers:
        is_rls = isinstance(rls, RlsProc)
        check_grpc_ok(rls.grpc_addr, req, 1)
        url = f"http://127.0.0.1:{rls.grpc_port}{METHOD}"
        h2load(url, body, clients=2, streams=16, duration=1.0, log_dir=d).check()  # warm-up
        before = rls.metrics() if is_rls else {}
        peak = h2load(url, body, clients=2, streams=16, duration=args.peak_duration,
                      label=f"{name} peak", log_dir=d)
        peak.check()
        peak_fm = failure_mode_answers(before, rls.metrics()) if is_rls else None
        if peak_fm is not None and not peak_fm.valid:
            print(f"{peak.label}: {peak_fm.count} failure-mode answers {peak_fm.breakdown}: "
                  "the peak (and so 'half of peak') is INVALID", flush=True)
        rates: list[tuple[str, float]] = []
        for r in args.rates.split(","):
            rates.append(("half of peak", peak.rps / 2) if r.strip() == "half"
                         else (f"{float(r):g}/s", float(r)))
        for label, rate in rates:
            before = rls.metrics() if is_rls else {}
            res = paced(rls.grpc_addr, METHOD, [req], rate, args.duration,
                        label=f"{name} {label}")
            fm = failure_mode_answers(before, rls.metrics()) if is_rls else None
            if label == "half of peak" and fm is not None and peak_fm is not None:
                fm = fm + peak_fm  # the rate itself comes from the peak run
            s = res.summary()
            # short of the offered rate, or calls that timed out: the clients and the server
            # together did not keep up on these cores (a point that measures queueing)
            saturated = res.achieved_rps < 0.95 * rate or res.errors > 0
            entry: dict[str, Any] = {
                "server": name, "point": label, "offered_rps": round(rate, 1),
                "achieved_rps": round(res.achieved_rps, 1), "peak_rps": round(peak.rps, 1),
                "saturated": saturated, "client_errors": res.errors,
                **(fm.json() if fm is not None else {"failure_mode_answers": None,
                                                     "valid": True}),
                "peak_failure_mode_answers": None if peak_fm is None else peak_fm.count,
                "latency": {k: s[k] for k in s if k.endswith("_ms") or k == "n"},
            }
            out.append(entry)
            rows.append([name, label, rate, res.achieved_rps, s["mean_ms"], s["p50_ms"],
                         s["p99_ms"], s["p999_ms"], s["max_ms"], "yes" if saturated else "no",
                         fm_cell(fm), validity(fm)])
            print(f"{res.label}: offered {rate:.0f}/s achieved {res.achieved_rps:.0f}/s "
                  f"p99 {s['p99_ms']} ms, failure-mode answers {fm_cell(fm)}", flush=True)
            if not is_rls:
                continue
            note = "saturated" if saturated else ""
            if label == "half of peak":
                targets.append(target_result(f"{name}: p99 < 5 ms at half of peak (ms)",
                                             s["p99_ms"], s["p99_ms"] < 5 and not saturated,
                                             fm, note))
            elif rate == 1000:
                targets.append(target_result(f"{name}: mean < 1 ms at 1,000 calls/s (ms)",
                                             s["mean_ms"], s["mean_ms"] < 1 and not saturated,
                                             fm, note))
    title = (f"Latency at fixed offered load: steady open loop (benchmarks/_common.py `paced`), "
             f"{args.duration:g} s per point, 3-descriptor request (allowed)")
    text = table(["server", "point", "offered/s", "achieved/s", "mean ms", "p50 ms", "p99 ms",
                  "p99.9 ms", "max ms", "saturated", "failure-mode answers", "valid"], rows,
                 title)
    text2 = print_targets(targets)
    write_results("latency_at_load", {"params": vars(args), "results": out,
                                      "target_results": targets}, args.quick, [text, text2])
    for _, rls in servers:
        rls.stop()
    redis.stop()


if __name__ == "__main__":
    main()
