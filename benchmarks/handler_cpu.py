"""rls's own work per call: the ShouldRateLimit handler alone, in process, no network.

What Envoy's calls cost rls's Python, with nothing else in the measurement: the real servicer
(`RateLimitService.should_rate_limit` of the app rls builds at start, real settings, metrics and
store), the real protobuf bytes Envoy sends for one gateway request (three descriptors: user +
path, api + user, remote address; benchmarks/_common.py), memoised as in production (the same
bytes again and again), limits never reached. A stand-in for grpc.aio's ServicerContext gives
the deadline Envoy sends (its 20 ms filter timeout) and nothing else.

Reported per store (memory; Redis on a redis-server this script starts on a free port):
- CPU µs per call (process CPU time over a round / calls), min / median / max over the rounds:
  behind Envoy, work under ~15 µs per call is nearly free and past ~20 µs it is amplified
  (docs/performance.md), so this is the figure to cut;
- Python function calls per call (sys.setprofile, in a separate pass);
- container objects allocated per call (gen-0 collections with the threshold at 1, in a
  separate pass: each collection follows one allocation of a GC-tracked object; an estimate);
- Redis commands per decision (INFO commandstats: an EVALSHA and each command its script
  runs): 1 + one INCRBY per descriptor without leases, a refill per many decisions with them
  (`redis-leases`: `--redis-leases`; the same bytes again and again are hot keys);
- calls answered by the failure mode during the timed rounds (a figure with any is INVALID);
- with `--in-server SECONDS`: the same handler's thread CPU per call inside a live grpc.aio
  server, h2load on the other core sending the same bytes (-c 8, the Envoy set-up's
  concurrency): what the handler costs where it really runs. It is 2 to 2.5 times the tight
  loop's figure on this machine: about half of that is the other core being busy (run the
  tight loop beside a spinning process with `--neighbour` to see it), the rest the caches
  grpc's own work between calls leaves cold (docs/performance.md, "Through the server").
  Not for Redis per call: its handler awaits the store, and a timer around it would count
  the other calls the loop runs meanwhile.
- with `--compare REV`: the same measurement of REV's rls (a detached worktree; this script
  runs there with PYTHONPATH at that tree), its rows printed beside this tree's, both sides
  alternating so they see the same machine.

    python benchmarks/handler_cpu.py                      # memory and Redis, ~30 s
    python benchmarks/handler_cpu.py --stores memory,redis,redis-leases   # leases too
    python benchmarks/handler_cpu.py --unique     # a new counter per call (no memo, no plan)
    python benchmarks/handler_cpu.py --stores memory --rounds 20 --calls 20000
    python benchmarks/handler_cpu.py --stores memory --in-server 5 --compare 25200ce
    python benchmarks/handler_cpu.py --stores memory --neighbour   # another core busy
    python benchmarks/handler_cpu.py --descriptors 1 --in-server 4 --compare 25200ce

Pair a hot-path change with its previous revision in one run with benchmarks/paired_rev.sh.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    BENCH_CONFIG,
    DESCRIPTORS,
    PYTHON,
    environment,
    free_port,
    h2load_binary,
    request_bytes,
    revision_tree,
    start_redis,
    workdir,
    write_frame,
    write_results,
)

SERVICE_PATH = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"


class Context:
    """What the handler asks of grpc.aio's ServicerContext on a decided call."""

    def __init__(self, deadline_s: float) -> None:
        self._deadline = deadline_s

    def time_remaining(self) -> float:
        return self._deadline

    async def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"aborted: {code} {details}")

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"


def build(store_url: str | None, config_dir: Path, leases: bool = False) -> Any:
    try:
        from rls.process.server import build_app
    except ImportError:  # an older revision (--compare)
        from rls.assembly import build_app  # type: ignore[no-redef]
    from rls.settings import Settings

    extra = {"redis_leases": True} if leases else {}  # an older revision has no such setting
    settings = Settings(config=[str(config_dir)], redis_url=store_url or "", **extra)
    app = build_app(settings)
    if not app.holder.reload(log_error=True):
        raise SystemExit(f"config did not load: {app.holder.last_error}")
    return app


def redis_commands(app: Any) -> int | None:
    """Commands Redis ran so far (an EVALSHA and each command its script ran count one each),
    None for the memory store."""
    url = app.settings.redis_url
    if not url:
        return None
    import redis

    stats = redis.Redis.from_url(url).info("commandstats")
    ignored = ("cmdstat_info", "cmdstat_ping", "cmdstat_script", "cmdstat_client",
               "cmdstat_hello", "cmdstat_time", "cmdstat_select", "cmdstat_command")
    return sum(int(v["calls"]) for k, v in stats.items()
               if k.startswith("cmdstat_") and k not in ignored)


def failure_answers(app: Any) -> float:
    total = 0.0
    for family in app.metrics.failure_answers.collect():
        total += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return total


async def run_store(store: str, url: str | None, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "bench.yaml").write_text(BENCH_CONFIG)
        app = build(url, Path(tmp), leases=store == "redis-leases")
        await app.backend.start()
        try:
            return await measure(store, app, args)
        finally:
            await app.backend.close()


def unique_requests(n: int) -> list[bytes]:
    """`n` requests of the gateway shape, each with its own client address: a new counter
    and a request never seen before (no memo, no plan) on every call."""
    return [
        request_bytes(descriptors=(*DESCRIPTORS[:2],
                                   (("remote_address", f"10.{i >> 16 & 255}.{i >> 8 & 255}"
                                                       f".{i & 255}"),)))
        for i in range(n)
    ]


async def measure(store: str, app: Any, args: argparse.Namespace) -> dict[str, Any]:
    handler = app.service.should_rate_limit
    data = request_bytes(descriptors=DESCRIPTORS[:args.descriptors])
    ctx = Context(0.020)
    for _ in range(2000):  # warm: memo, scripts, connections
        await handler(data, ctx)
    app.metrics.flush()
    before_failures = failure_answers(app)
    fresh = unique_requests(args.rounds * args.calls) if args.unique else None

    commands_before = redis_commands(app)
    gc.collect()
    # --neighbour: the other core spins, as h2load or Envoy keep it busy in a real run.
    neighbour = (subprocess.Popen([PYTHON, "-c", "while True: pass"]) if args.neighbour
                 else None)
    try:
        per_call = await timed_rounds(handler, data, ctx, fresh, args)
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
    app.metrics.flush()
    commands = redis_commands(app)
    per_decision = (None if commands is None or commands_before is None
                    else (commands - commands_before) / (args.rounds * args.calls))

    calls = await count_python_calls(handler, data, ctx, args.count_calls)
    objects = await count_allocations(handler, data, ctx, args.count_calls)
    # Redis per call awaits the store: a timer around the handler would count the other
    # calls the loop runs meanwhile, so only stores that decide at once are timed in a server.
    timed_here = args.in_server and store != "redis"
    in_server = await measure_in_server(app, data, args) if timed_here else None
    app.metrics.flush()
    failures = failure_answers(app) - before_failures
    row = {
        "store": store,
        "unique_keys": args.unique,
        "descriptors": args.descriptors,
        "cpu_us_per_call": {"min": min(per_call), "median": statistics.median(per_call),
                            "max": max(per_call)},
        "python_calls_per_call": calls,
        "gc_objects_per_call": objects,
        "failure_mode_answers": failures,
        "redis_commands_per_decision": per_decision,
        "in_server": in_server,
        "neighbour": args.neighbour,
        "rounds": args.rounds,
        "calls_per_round": args.calls,
    }
    return row


async def timed_rounds(handler: Any, data: bytes, ctx: Context, fresh: list[bytes] | None,
                       args: argparse.Namespace) -> list[float]:
    """Process CPU µs per call of each round: the same bytes, or `fresh` ones (--unique)."""
    per_call: list[float] = []
    for r in range(args.rounds):
        start = time.process_time()
        if fresh is None:
            for _ in range(args.calls):
                await handler(data, ctx)
        else:
            for one in fresh[r * args.calls:(r + 1) * args.calls]:
                await handler(one, ctx)
        per_call.append((time.process_time() - start) / args.calls * 1e6)
    return per_call


async def measure_in_server(app: Any, data: bytes, args: argparse.Namespace) -> dict[str, Any]:
    """The handler's own thread CPU per call inside a live grpc.aio server (the servicer rls
    registers, wrapped to time each call), under h2load: `args.rounds` loads of
    `args.in_server` seconds each, -c 8 -m 1 as the Envoy set-up. Returns the handler's CPU
    µs per call (min / median / max over the loads), the process's CPU per call and req/s."""
    import grpc

    service = app.service
    inner = service.should_rate_limit
    spent = [0, 0]  # thread CPU ns, calls
    thread_ns = time.thread_time_ns

    async def timed(request: bytes, context: Any) -> bytes:
        start = thread_ns()
        answer: bytes = await inner(request, context)
        spent[0] += thread_ns() - start
        spent[1] += 1
        return answer

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        SERVICE_PATH.split("/")[1],
        {"ShouldRateLimit": grpc.unary_unary_rpc_method_handler(timed)},
    ),))
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    body = write_frame(workdir("handler-cpu") / "request.bin", data)
    handler_us: list[float] = []
    process_us: list[float] = []
    rates: list[float] = []
    try:
        for _ in range(max(args.rounds // 2, 1)):
            spent[0] = spent[1] = 0
            cpu = time.process_time()
            started = time.perf_counter()
            load = await asyncio.create_subprocess_exec(
                h2load_binary(), "-t", "1", "-c", "8", "-m", "1",
                "-D", str(round(args.in_server)), "-d", str(body),
                "-H", "content-type: application/grpc", "-H", "te: trailers",
                f"http://127.0.0.1:{port}{SERVICE_PATH}",
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            await asyncio.wait_for(load.wait(), args.in_server + 30)
            elapsed = time.perf_counter() - started
            calls = max(spent[1], 1)
            handler_us.append(spent[0] / calls / 1000)
            process_us.append((time.process_time() - cpu) / calls * 1e6)
            rates.append(spent[1] / elapsed)
    finally:
        await server.stop(0)
    return {
        "handler_cpu_us_per_call": {"min": min(handler_us),
                                    "median": statistics.median(handler_us),
                                    "max": max(handler_us)},
        "process_cpu_us_per_call": statistics.median(process_us),
        "calls_per_s": statistics.median(rates),
        "loads": len(handler_us),
        "seconds_per_load": args.in_server,
    }


async def count_python_calls(handler: Any, data: bytes, ctx: Context, n: int) -> float:
    count = 0

    def profile(_frame: Any, event: str, _arg: Any) -> None:
        nonlocal count
        if event == "call":
            count += 1

    sys.setprofile(profile)
    try:
        for _ in range(n):
            await handler(data, ctx)
    finally:
        sys.setprofile(None)
    return count / n


async def count_allocations(handler: Any, data: bytes, ctx: Context, n: int) -> float:
    collections = 0

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        nonlocal collections
        if phase == "start" and info.get("generation") == 0:
            collections += 1

    gc.collect()
    old = gc.get_threshold()
    gc.callbacks.append(on_gc)
    gc.set_threshold(1, 1_000_000, 1_000_000)
    try:
        for _ in range(n):
            await handler(data, ctx)
    finally:
        gc.set_threshold(*old)
        gc.callbacks.remove(on_gc)
    return 2 * collections / n  # a collection follows every second tracked allocation


def measure_stores(stores: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every store's row, with the rls this interpreter imports."""
    try:
        import uvloop
        loop_factory: Any = uvloop.new_event_loop
    except ImportError:
        loop_factory = asyncio.new_event_loop
    rows = []
    for store in stores:
        if store.startswith("redis"):
            server = start_redis()
            try:
                with asyncio.Runner(loop_factory=loop_factory) as runner:
                    rows.append(runner.run(run_store(store, server.url, args)))
            finally:
                server.stop()
        else:
            with asyncio.Runner(loop_factory=loop_factory) as runner:
                rows.append(runner.run(run_store(store, None, args)))
    return rows


def measure_at(tree: Path | None, store: str, argv: list[str]) -> dict[str, Any]:
    """One store's row measured by a child of this script with the rls of `tree` (a
    revision's worktree first on PYTHONPATH), or this tree's rls (None)."""
    out = workdir("handler-cpu") / f"row-{time.monotonic_ns()}.json"
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    cmd = [PYTHON, str(Path(__file__).resolve()), *argv, "--stores", store, "--json-out", str(out)]
    subprocess.run(cmd, check=True, env=env, cwd=tree, stdout=subprocess.DEVNULL)
    row: dict[str, Any] = json.loads(out.read_text())[0]
    return row


def child_argv(args: argparse.Namespace) -> list[str]:
    argv = ["--rounds", str(args.rounds), "--calls", str(args.calls),
            "--count-calls", str(args.count_calls), "--descriptors", str(args.descriptors)]
    if args.unique:
        argv.append("--unique")
    if args.neighbour:
        argv.append("--neighbour")
    if args.in_server:
        argv += ["--in-server", str(args.in_server)]
    return argv


def print_rows(rows: list[dict[str, Any]]) -> None:
    print(f"{'rls':8} {'store':13} {'CPU µs/call min/median/max':>28} {'py calls':>9} "
          f"{'objects':>8} {'Redis cmds/decision':>20} {'in server µs':>13} "
          f"{'failure-mode answers':>21}")
    for row in rows:
        cpu = row["cpu_us_per_call"]
        valid = "" if row["failure_mode_answers"] == 0 else "  INVALID"
        cmds = row["redis_commands_per_decision"]
        cmds_cell = "-" if cmds is None else f"{cmds:.3f}"
        served = row.get("in_server")
        served_cell = ("-" if not served
                       else f"{served['handler_cpu_us_per_call']['median']:.1f}")
        print(f"{row.get('revision', 'this'):8} {row['store']:13} {cpu['min']:8.1f} "
              f"{cpu['median']:8.1f} {cpu['max']:8.1f}    "
              f"{row['python_calls_per_call']:9.1f} {row['gc_objects_per_call']:8.1f} "
              f"{cmds_cell:>20} {served_cell:>13} {row['failure_mode_answers']:21.0f}{valid}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="memory,redis")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=10_000, help="calls per timed round")
    parser.add_argument("--count-calls", type=int, default=500,
                        help="calls in the counting passes (Python calls, allocations)")
    parser.add_argument("--descriptors", type=int, default=3, choices=(1, 2, 3),
                        help="the first N descriptors of the gateway request (1: user + path)")
    parser.add_argument("--unique", action="store_true",
                        help="a new client address (a new counter, no memo) on every call")
    parser.add_argument("--neighbour", action="store_true",
                        help="a process spins on the other core during the timed rounds")
    parser.add_argument("--in-server", type=float, default=0.0, metavar="SECONDS",
                        help="also time the handler inside a live grpc.aio server under "
                             "h2load, rounds/2 loads of SECONDS each")
    parser.add_argument("--compare", action="append", default=[], metavar="REV",
                        help="the same measurement with REV's rls, alternating with this tree")
    parser.add_argument("--json-out", help=argparse.SUPPRESS)  # a --compare child's rows
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.calls, args.count_calls = 3, 1000, 50
    stores = args.stores.split(",")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(measure_stores(stores, args)))
        return
    if not args.compare:
        rows = measure_stores(stores, args)
    else:
        revs = [revision_tree(rev, workdir("handler-cpu-revs")) for rev in args.compare]
        trees: list[tuple[str, Path | None]] = [("this", None), *revs]
        rows = []
        try:
            for i, store in enumerate(stores):
                # alternate who goes first, so both sides see the same machine
                for label, tree in trees if i % 2 == 0 else list(reversed(trees)):
                    if store == "redis-leases" and tree is not None:
                        continue  # an older revision has no leases
                    row = measure_at(tree, store, child_argv(args))
                    row["revision"] = label
                    rows.append(row)
        finally:
            for _, path in revs:
                subprocess.run(["git", "-C", str(path), "worktree", "remove", "--force",
                                str(path)], check=False, capture_output=True)
    print_rows(rows)
    name = "handler_cpu_unique" if args.unique else "handler_cpu"
    write_results(name, {"rows": rows, "environment": environment()}, args.quick)


if __name__ == "__main__":
    main()
