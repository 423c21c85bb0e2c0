"""Server CPU per call, paired: every variant up at once, rounds alternating, one command.

A hot-path change is judged by what one decision costs the server (user + system CPU of the
server process, all its threads, divided by the calls it answered), not by req/s alone, which
the load tool and the neighbours share. Every variant runs in the same period: all servers
start at once, and each round runs every variant once in a rotated order, so machine noise
hits them alike. Reported per variant: min / median / max of CPU µs per call over the rounds,
median req/s, both as ratios to the floor on the same event loop, and the calls answered by
the failure mode during its runs (a figure with any is INVALID).

Variants:
- `floor/<loop>`: the empty grpc.aio handler (benchmarks/floor_server.py) on uvloop and asyncio;
- `tree <store>`: rls of this checkout (memory, Redis), on its default loop;
- `tree <store> asyncio`: the same with `--loop asyncio` (with `--both-loops`);
- `tree <store> tracing <rate>`: this tree's rls with OpenTelemetry tracing on at that sampling
  rate (`--tracing RATE`, repeatable), exporting OTLP/HTTP to a sink in this process (its CPU
  is not the server's; the server's exporter thread is);
- `<rev> <store>`: rls at a git revision (`--compare REV`, repeatable): a detached worktree of
  that revision, run with its own code (`python -m rls` from the worktree) on its own default
  loop, so a regression since REV shows in one command.

Load: h2load -n N -c C -m M of one pre-serialized request (1 descriptor by default, never over
its limit). Redis: one redis-server for all Redis variants (they never run at once).

TLS (`--tls`): also `tree <store> tls` (rls with --grpc-tls, no client certificates),
`tree <store> mtls` (client certificates required) and `tree <store> mtls+san` (and a SAN
checked at each call), with certificates made by openssl
(tests/support/certs.py). h2load speaks TLS but cannot present a client certificate, so the
mtls variants need `--load grpc`: every variant is then loaded by benchmarks/grpc_load.py (a
grpc.aio client with certificates), the same generator for all, so their server CPU per call
compares; the client's own CPU is far higher than h2load's and shares the machine.

    python benchmarks/cpu_per_call.py --tls --load grpc --stores memory -n 20000
    python benchmarks/cpu_per_call.py --tls --stores memory     # plaintext vs TLS, h2load

    python benchmarks/cpu_per_call.py --compare aa7ce0d --compare c9b4b14
    python benchmarks/cpu_per_call.py --quick        # a smoke run (a few seconds per variant)
    python benchmarks/cpu_per_call.py --stores memory --compare main --tracing 1 --tracing 0.01
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from _common import (
    DESCRIPTORS,
    METHOD,
    NO_FAILURE_ANSWERS,
    PYTHON,
    ROOT,
    FailureModeAnswers,
    FloorProc,
    H2Result,
    Proc,
    RlsProc,
    check_grpc_ok,
    failure_mode_answers,
    grpc_call,
    h2load,
    median,
    process_cpu_s,
    request_bytes,
    revision_tree,
    start_floor,
    start_redis,
    start_rls_at,
    table,
    validity,
    workdir,
    write_config,
    write_frame,
    write_results,
)


@dataclass
class Variant:
    name: str
    loop: str  # the floor it is compared with
    proc: Proc
    port: int
    rls: RlsProc | None = None
    cpu_us: list[float] = field(default_factory=list)
    rps: list[float] = field(default_factory=list)
    fm: FailureModeAnswers = field(default_factory=lambda: NO_FAILURE_ANSWERS)
    tls: list[str] | None = None  # grpc_load.py's TLS arguments; None: plaintext


def tls_setup(d: Path) -> dict[str, tuple[list[str], list[str]]]:
    """Per TLS variant: (rls serve flags, grpc_load.py flags); certificates made by openssl."""
    sys.path.insert(0, str(ROOT / "tests"))
    from support.certs import CertAuthority

    ca = CertAuthority.create(d / "pki")
    san = "spiffe://bench/client"
    server, client = ca.issue("server"), ca.issue("client", sans=(f"URI:{san}",), client=True)
    served = ["--grpc-tls", "on", "--grpc-tls-cert", str(server.cert),
              "--grpc-tls-key", str(server.key)]
    trust = ["--ca", str(ca.cert), "--sni", "localhost"]
    mutual = [*served, "--grpc-tls-client-ca", str(ca.cert)]
    presented = [*trust, "--cert", str(client.cert), "--key", str(client.key)]
    return {
        "tls": (served, trust),
        "mtls": (mutual, presented),
        "mtls+san": ([*mutual, "--grpc-tls-client-san", san], presented),
    }


def grpc_load(v: Variant, message: Path, args: argparse.Namespace, requests: int) -> H2Result:
    """benchmarks/grpc_load.py against one variant, as an H2Result (same checks)."""
    cmd = [PYTHON, str(ROOT / "benchmarks" / "grpc_load.py"), f"127.0.0.1:{v.port}",
           str(message), "-n", str(requests), "-c", str(args.clients), "-m", str(args.streams),
           *(v.tls or [])]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"grpc_load {v.name} failed: {done.stderr}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return H2Result(v.name, out["total"], out["ok"], out["errors"], 0, 0, out["ok"],
                    out["elapsed_s"], out["rps"], command=cmd)


def load(v: Variant, body: Path, args: argparse.Namespace, log_dir: Path,
         requests: int) -> H2Result:
    """One closed-loop run of `requests` calls with the chosen generator."""
    if args.load == "grpc":
        return grpc_load(v, body.with_suffix(".msg"), args, requests)
    scheme = "https" if v.tls is not None else "http"
    return h2load(f"{scheme}://127.0.0.1:{v.port}{METHOD}", body, clients=args.clients,
                  streams=args.streams, requests=requests, label=v.name, log_dir=log_dir)


class OtlpSink(BaseHTTPRequestHandler):
    """Takes OTLP/HTTP exports and answers 200 (the traced variants' collector)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def start_sink() -> str:
    """An OTLP/HTTP sink on a free port, in this process; its OTEL_EXPORTER_OTLP_ENDPOINT."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), OtlpSink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def loop_of(code: Path | None, extra: list[str]) -> str:
    """The loop an rls runs on: asyncio when told so or when its code predates `--loop`
    (rls/event_loop.py), else its default (uvloop where installed)."""
    from rls.event_loop import loop_name

    if "asyncio" in extra or (code is not None and not (code / "rls/event_loop.py").exists()):
        return "asyncio"
    return loop_name("auto")


def measure(v: Variant, body: Path, args: argparse.Namespace, log_dir: Path) -> None:
    before = v.rls.metrics() if v.rls else None
    cpu0 = process_cpu_s(v.proc.pid)
    res = load(v, body, args, log_dir, args.requests)
    cpu = process_cpu_s(v.proc.pid) - cpu0
    res.check()
    v.cpu_us.append(cpu * 1e6 / max(res.total, 1))
    v.rps.append(res.rps)
    if v.rls is not None and before is not None:
        fm = failure_mode_answers(before, v.rls.metrics())
        v.fm = v.fm + fm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", action="append", default=[], metavar="REV",
                        help="also run rls at this git revision (repeatable)")
    parser.add_argument("--both-loops", action="store_true",
                        help="also run this tree's rls with --loop asyncio")
    parser.add_argument("--stores", default="memory,redis", help="memory,redis")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-n", "--requests", type=int, default=40_000)
    parser.add_argument("-c", "--clients", type=int, default=4)
    parser.add_argument("-m", "--streams", type=int, default=32)
    parser.add_argument("--descriptors", type=int, default=1, choices=(1, 3))
    parser.add_argument("--rls-arg", action="append", default=[], metavar="ARG",
                        help="extra `rls serve` argument for this tree's rls (repeatable)")
    parser.add_argument("--tracing", action="append", default=[], type=float, metavar="RATE",
                        help="also run this tree's rls with tracing on at RATE (repeatable)")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 4,000 calls")
    parser.add_argument("--tls", action="store_true",
                        help="also this tree's rls over TLS and (with --load grpc) mTLS")
    parser.add_argument("--load", choices=("h2load", "grpc"), default="h2load",
                        help="load generator: h2load, or benchmarks/grpc_load.py (needed to "
                        "present a client certificate)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.requests = 2, 4_000

    d = workdir("cpu_per_call")
    cfg = write_config(d / "config")
    stores = [s for s in args.stores.split(",") if s]
    redis = start_redis(d) if "redis" in stores else None
    descriptors = DESCRIPTORS[2:] if args.descriptors == 1 else DESCRIPTORS
    body = write_frame(d / "request.bin", request_bytes("bench", descriptors))
    body.with_suffix(".msg").write_bytes(request_bytes("bench", descriptors))
    tls = tls_setup(d) if args.tls else {}
    if args.load == "h2load":  # h2load cannot present a client certificate
        tls = {kind: v for kind, v in tls.items() if kind == "tls"}

    variants: list[Variant] = []
    floors: dict[str, FloorProc] = {}
    for loop in ("uvloop", "asyncio"):
        floors[loop] = start_floor(d, loop)
        variants.append(Variant(f"floor/{loop}", loop, floors[loop], floors[loop].grpc_port))
    trees: list[tuple[str, Path | None, list[str]]] = [("tree", None, list(args.rls_arg))]
    if args.both_loops:
        trees.append(("tree asyncio", None, [*args.rls_arg, "--loop", "asyncio"]))
    sink = {"OTEL_EXPORTER_OTLP_ENDPOINT": start_sink()} if args.tracing else {}
    for rate in args.tracing:
        trees.append((f"tree tracing {rate:g}", None, [
            *args.rls_arg, "--tracing-enabled", "on", "--tracing-sampling-rate", str(rate)]))
    worktrees: list[Path] = []
    for rev in args.compare:
        sha, path = revision_tree(rev, d)
        worktrees.append(path)
        trees.append((sha, path, []))
    try:
        for label, code, extra in trees:
            for store in stores:
                url = redis.url if store == "redis" and redis else None
                name = f"{label} {store}"
                rls = start_rls_at(cfg, d, name, code, url, extra, sink)
                variants.append(Variant(name, loop_of(code, extra), rls, rls.grpc_port, rls))
                if code is not None or label != "tree":
                    continue
                for kind, (served, client) in tls.items():
                    rls = start_rls_at(cfg, d, f"{name} {kind}", code, url, [*extra, *served])
                    variants.append(Variant(f"{name} {kind}", loop_of(code, extra), rls,
                                            rls.grpc_port, rls, tls=client))
        for v in variants:  # one real call each (grpc-status 0), then a warm-up
            if v.tls is None:
                check_grpc_ok(f"127.0.0.1:{v.port}", request_bytes("bench", descriptors))
                assert grpc_call(f"127.0.0.1:{v.port}",
                                 request_bytes("bench", descriptors))[0] == 0
            load(v, body, args, d, max(2_000, args.requests // 10)).check()
        for r in range(args.rounds):
            order = variants[r % len(variants):] + variants[: r % len(variants)]
            for v in order:
                measure(v, body, args, d)
                print(f"round {r + 1}: {v.name:<24} {v.cpu_us[-1]:7.1f} µs/call "
                      f"{v.rps[-1]:9.1f} req/s", flush=True)
    finally:
        for v in variants:
            v.proc.stop()
        if redis is not None:
            redis.stop()
        for path in worktrees:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                           capture_output=True)
            shutil.rmtree(path, ignore_errors=True)

    floor_cpu = {v.loop: median(v.cpu_us) for v in variants if v.name.startswith("floor/")}
    floor_rps = {v.loop: median(v.rps) for v in variants if v.name.startswith("floor/")}
    rows: list[list[Any]] = []
    out: list[dict[str, Any]] = []
    for v in variants:
        cpu = median(v.cpu_us)
        rps = median(v.rps)
        fm = v.fm if v.rls is not None else None
        entry = {
            "variant": v.name, "loop": v.loop,
            "cpu_us_per_call": {"min": round(min(v.cpu_us), 1), "median": round(cpu, 1),
                                "max": round(max(v.cpu_us), 1)},
            "cpu_rounds": [round(x, 1) for x in v.cpu_us],
            "rps_median": round(rps, 1), "rps_rounds": [round(x, 1) for x in v.rps],
            "floor_cpu_over_cpu": round(floor_cpu[v.loop] / cpu, 3),
            "rps_over_floor_rps": round(rps / floor_rps[v.loop], 3),
            **(fm.json() if fm is not None else {"failure_mode_answers": None, "valid": True}),
        }
        out.append(entry)
        rows.append([v.name, v.loop, f"{min(v.cpu_us):.0f}", f"{cpu:.0f}",
                     f"{max(v.cpu_us):.0f}", f"{floor_cpu[v.loop] / cpu:.2f}", f"{rps:.0f}",
                     f"{rps / floor_rps[v.loop]:.2f}", "-" if fm is None else fm.count,
                     validity(fm)])
    title = (f"Server CPU per call, paired: {args.load} -n {args.requests} -c {args.clients} "
             f"-m {args.streams}, {args.rounds} rounds, {args.descriptors}-descriptor request")
    text = table(["variant", "loop", "CPU µs min", "median", "max", "x floor (CPU)", "req/s",
                  "x floor (req/s)", "failure-mode answers", "valid"], rows, title)
    write_results("cpu_per_call", {"params": vars(args), "results": out}, args.quick, [text])


if __name__ == "__main__":
    main()
