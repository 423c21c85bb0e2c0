"""Decision latency while a control plane pushes 10,000 domains over xDS.

rls (memory store, CONFIG_TYPE=GRPC_XDS_SOTW) follows an in-process ADS server
(tests/config/xds/ads_server.py). A steady open loop of ShouldRateLimit calls
(`_common.paced`) runs twice: once with no push, once while the server pushes sets of 10,000
domains (plus the benchmark's own) one after the other, each built off the event loop and
swapped in. Windows alternate (no push, push) for --rounds pairs so that both kinds share the
machine's noise; each row has p50/p99/p99.9, the calls answered in error, the sets applied
during it and the load average after it.

    python benchmarks/xds_push_latency.py [--rate 200] [--seconds 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import threading
import time
from typing import Any

from _common import (
    HIGH,
    METHOD,
    PYTHON,
    ROOT,
    free_port,
    grpc_call,
    http_get,
    latency_stats,
    paced,
    request_bytes,
    spawn,
    table,
    wait_until,
    workdir,
)

sys.path.insert(0, str(ROOT / "tests"))
from xds_config.ads_server import AdsServer, domain, limit, pack, pb


def bench_domain() -> Any:
    high = pb.RateLimitPolicy(unit=pb.MINUTE, requests_per_unit=HIGH)
    return domain(
        "bench",
        pb.RateLimitDescriptor(key="user", descriptors=[
            pb.RateLimitDescriptor(key="path", rate_limit=high)]),
        pb.RateLimitDescriptor(key="api", value="items", descriptors=[
            pb.RateLimitDescriptor(key="user", rate_limit=high)]),
        pb.RateLimitDescriptor(key="remote_address", rate_limit=high),
    )


def many(tag: int) -> list[Any]:
    return [domain(f"d{tag}-{i:05d}", limit("key", "MINUTE", 10 + tag)) for i in range(10_000)]


def window(ads: AdsServer, sets: list[list[Any]], addr: str, body: list[bytes],
           args: argparse.Namespace, pushing: bool) -> tuple[Any, int]:
    """One paced window; with `pushing`, 10,000-domain sets are pushed one after the other
    (the next as soon as the last is ACKed) for its whole length."""
    applied = 0
    stop = threading.Event()

    def push() -> None:
        nonlocal applied
        version = 0
        time.sleep(1.0)  # the paced clients are connected and sending
        while not stop.is_set():
            version += 1
            tag = f"{time.monotonic_ns()}"
            ads.set_snapshot(tag, sets[version % 2])
            ads.wait_ack(tag, timeout=300)
            if not stop.is_set():
                applied += 1

    pusher = threading.Thread(target=push, daemon=True)
    if pushing:
        pusher.start()
    label = "10,000-domain pushes" if pushing else "no push"
    result = paced(addr, METHOD, body, args.rate, args.seconds, label)
    stop.set()
    if pushing:
        pusher.join(timeout=300)
    return result, applied


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200.0, help="calls/s (open loop)")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3, help="no-push/push window pairs")
    args = parser.parse_args()
    # The paced clients are processes: spawned, not forked from a process serving gRPC.
    multiprocessing.set_start_method("spawn")
    logs = workdir("xds-push")
    ads = AdsServer().start()
    ads.set_snapshot("0", [bench_domain()])
    env = {"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": ads.url}
    grpc_port, http_port = free_port(), free_port()
    proc = spawn([PYTHON, "-m", "rls", "serve", "--grpc-addr", f"127.0.0.1:{grpc_port}",
                  "--http-addr", f"127.0.0.1:{http_port}", "--log-level", "warning"],
                 "rls", logs, env=env)
    addr = f"127.0.0.1:{grpc_port}"
    wait_until(lambda: http_get(f"http://127.0.0.1:{http_port}/healthcheck")[0] == 200, 30,
               "rls healthy", proc.proc, proc.log_path)
    wait_until(lambda: grpc_call(addr, request_bytes("bench"))[0] == 0, 30, "rls gRPC",
               proc.proc, proc.log_path)
    sets = [[pack(r) for r in (bench_domain(), *many(tag))] for tag in (1, 2)]  # packed once
    body = [request_bytes("bench")]
    rows = []
    for round_ in range(1, args.rounds + 1):  # alternating, so both kinds share the noise
        for pushing in (False, True):
            result, applied = window(ads, sets, addr, body, args, pushing)
            stats = latency_stats(result.latencies_us)
            rows.append([round_, result.label, round(result.achieved_rps), result.errors,
                         stats["p50_ms"], stats["p99_ms"], stats["p999_ms"],
                         applied if pushing else "-", round(os.getloadavg()[0], 1)])
    print(table(["round", "run", "calls/s", "errors", "p50 ms", "p99 ms", "p99.9 ms",
                 "sets applied", "load"], rows,
                f"ShouldRateLimit latency at {args.rate:g} calls/s, {args.seconds:g} s windows"))
    proc.stop()
    ads.stop()


if __name__ == "__main__":
    main()
