"""Throughput with `rls serve --workers 1` vs `--workers 2` (Redis backend), and the ratio.

Both run at once against one private redis-server; h2load runs are interleaved over `--rounds`
(median req/s). The kernel spreads connections over the workers with SO_REUSEPORT, so h2load
opens `--clients` connections (default 8, enough for an even spread); the CPU time each worker
process used during the runs is reported to show the split. If `--workers` is not supported
(rls exits with an error) or starts no extra processes, that is reported instead of a ratio.

performance target: 2 workers >= 1.8x one worker where the cores exist. Note the cores: on a
2-core machine h2load and redis-server share them with the workers.

Every figure carries the calls answered by the failure mode in its measured runs
(rls_failure_mode_answers_total + rls_request_errors_total, scraped before and after each run);
a figure with any is marked INVALID and fails the target. rls runs with its production
defaults (`--rls-arg` adds `rls serve` arguments).

    python benchmarks/workers_scale.py [--quick] [--rounds 3] [--duration 4]
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from _common import (
    METHOD,
    NO_FAILURE_ANSWERS,
    FailureModeAnswers,
    check_grpc_ok,
    h2load,
    latency_stats,
    median,
    print_targets,
    request_bytes,
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


def processes(pid: int) -> list[Any]:
    """The rls processes that serve: the workers under a supervisor, else the process itself."""
    import psutil

    root = psutil.Process(pid)
    children = [p for p in root.children(recursive=True) if "python" in p.name().lower()
                or "rls" in " ".join(p.cmdline())]
    return children or [root]


def cpu_seconds(procs: list[Any]) -> list[float]:
    out = []
    for p in procs:
        try:
            t = p.cpu_times()
            out.append(t.user + t.system)
        except Exception:
            out.append(float("nan"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few seconds: smoke test")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--clients", type=int, default=8, help="h2load -c (connections)")
    parser.add_argument("--streams", type=int, default=8, help="h2load -m")
    parser.add_argument("--rls-arg", action="append", default=[], metavar="ARG",
                        help="extra `rls serve` argument, repeatable "
                             "(e.g. --rls-arg=--backend-timeout-ms=100); default: none")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.duration = 1, 1.0

    d = workdir("workers")
    cfg = write_config(d / "config")
    redis = start_redis(d)
    req = request_bytes("bench")
    body = write_frame(d / "req.bin", req)
    result: dict[str, Any] = {"params": vars(args), "cpus": os.cpu_count()}

    servers: dict[int, Any] = {}
    for n in (1, 2):
        try:
            servers[n] = start_rls(
                cfg, d, redis_url=redis.url, name=f"rls-w{n}",
                extra=["--workers", str(n), *args.rls_arg])
        except RuntimeError as exc:
            if n == 1:
                raise  # rls does not start at all: not a question of --workers
            result["supported"] = False
            result["error"] = str(exc)
            print(f"--workers {n}: rls did not start:\n{exc}")
            text = table(["workers", "status"], [[n, "not supported: rls exited with an error"]],
                         "Workers scale")
            write_results("workers_scale", result, args.quick, [text])
            redis.stop()
            return
    procs = {n: processes(s.pid) for n, s in servers.items()}
    result["processes"] = {n: [p.pid for p in ps] for n, ps in procs.items()}
    if len(procs[2]) < 2:
        result["supported"] = False
        result["error"] = "--workers 2 started no extra worker process"
        text = table(["workers", "status"], [[2, result["error"]]], "Workers scale")
        write_results("workers_scale", result, args.quick, [text])
        return
    result["supported"] = True

    for s in servers.values():
        check_grpc_ok(s.grpc_addr, req, 1)
        h2load(f"http://127.0.0.1:{s.grpc_port}{METHOD}", body, clients=args.clients,
               streams=args.streams, duration=1.0, log_dir=d).check()  # warm-up

    runs: dict[int, list[Any]] = {1: [], 2: []}
    cpu: dict[int, list[float]] = {n: [0.0] * len(procs[n]) for n in procs}
    fm_kept: dict[int, FailureModeAnswers] = {1: NO_FAILURE_ANSWERS, 2: NO_FAILURE_ANSWERS}
    for r in range(args.rounds):
        for n in ((1, 2) if r % 2 == 0 else (2, 1)):
            s = servers[n]
            before, cpu0 = s.metrics(), cpu_seconds(procs[n])
            res = h2load(f"http://127.0.0.1:{s.grpc_port}{METHOD}", body,
                         clients=args.clients, streams=args.streams,
                         duration=args.duration, label=f"workers {n}", log_dir=d)
            res.check()
            cpu1 = cpu_seconds(procs[n])
            _, fm = verify_rls_run(s, before, res.total, args.clients * args.streams,
                                   res.label, code="OK")
            if not fm.valid:
                print(f"{res.label}: {fm.count} calls answered by the failure mode "
                      f"{fm.breakdown}: this figure is INVALID", flush=True)
            fm_kept[n] = fm_kept[n] + fm
            cpu[n] = [a + (y - x) for a, x, y in zip(cpu[n], cpu0, cpu1, strict=True)]
            runs[n].append(res)
            print(f"round {r + 1}: workers {n}: {res.rps:9.1f} req/s", flush=True)

    rps = {n: median([x.rps for x in runs[n]]) for n in runs}
    ratio = rps[2] / rps[1]
    rows = []
    for n in (1, 2):
        lat = latency_stats([us for x in runs[n] for us in x.latencies_us])
        share = cpu[n]
        rows.append([n, rps[n], " ".join(f"{x.rps:.0f}" for x in runs[n]),
                     f"{rps[n] / rps[1]:.2f}", lat["mean_ms"], lat["p99_ms"],
                     " / ".join(f"{c:.1f}" for c in share), fm_kept[n].count,
                     validity(fm_kept[n])])
        result[f"workers_{n}"] = {"rps_median": round(rps[n], 1),
                                  "rps_rounds": [round(x.rps, 1) for x in runs[n]],
                                  "latency": lat, "cpu_seconds_per_process": share,
                                  **fm_kept[n].json()}
    result["ratio"] = round(ratio, 3)
    title = (f"Workers scale (Redis backend): h2load -c {args.clients} -m {args.streams}, "
             f"{args.duration:g} s x {args.rounds} round(s), {os.cpu_count()} CPUs")
    text = table(["workers", "req/s (median)", "rounds", "x 1 worker", "mean ms", "p99 ms",
                  "CPU s per worker process", "failure-mode answers", "valid"], rows, title)
    result["target_results"] = [target_result(
        "2 workers >= 1.8 x 1 worker (where the cores exist)", round(ratio, 3), ratio >= 1.8,
        fm_kept[1] + fm_kept[2], note=f"{os.cpu_count()} CPUs shared with h2load and Redis")]
    text2 = print_targets(result["target_results"])
    write_results("workers_scale", result, args.quick, [text, text2])
    for s in servers.values():
        s.stop()
    redis.stop()


if __name__ == "__main__":
    main()
