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
- calls answered by the failure mode during the timed rounds (a figure with any is INVALID).

    python benchmarks/handler_cpu.py                      # memory and Redis, ~30 s
    python benchmarks/handler_cpu.py --stores memory,redis,redis-leases   # leases too
    python benchmarks/handler_cpu.py --unique     # a new counter per call (no memo, no plan)
    python benchmarks/handler_cpu.py --stores memory --rounds 20 --calls 20000
    PYTHONPATH=/tmp/rls-old python benchmarks/handler_cpu.py   # another revision's rls

Pair a hot-path change with its previous revision in one run with benchmarks/paired_rev.sh.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    BENCH_CONFIG,
    DESCRIPTORS,
    environment,
    request_bytes,
    start_redis,
    write_results,
)


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
    from rls.process.server import build_app
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
    data = request_bytes()
    ctx = Context(0.020)
    for _ in range(2000):  # warm: memo, scripts, connections
        await handler(data, ctx)
    app.metrics.flush()
    before_failures = failure_answers(app)
    fresh = unique_requests(args.rounds * args.calls) if args.unique else None

    commands_before = redis_commands(app)
    per_call: list[float] = []
    gc.collect()
    for r in range(args.rounds):
        start = time.process_time()
        if fresh is None:
            for _ in range(args.calls):
                await handler(data, ctx)
        else:
            for one in fresh[r * args.calls:(r + 1) * args.calls]:
                await handler(one, ctx)
        per_call.append((time.process_time() - start) / args.calls * 1e6)
    app.metrics.flush()
    failures = failure_answers(app) - before_failures
    commands = redis_commands(app)
    per_decision = (None if commands is None or commands_before is None
                    else (commands - commands_before) / (args.rounds * args.calls))

    calls = await count_python_calls(handler, data, ctx, args.count_calls)
    objects = await count_allocations(handler, data, ctx, args.count_calls)
    row = {
        "store": store,
        "unique_keys": args.unique,
        "cpu_us_per_call": {"min": min(per_call), "median": statistics.median(per_call),
                            "max": max(per_call)},
        "python_calls_per_call": calls,
        "gc_objects_per_call": objects,
        "failure_mode_answers": failures,
        "redis_commands_per_decision": per_decision,
        "rounds": args.rounds,
        "calls_per_round": args.calls,
    }
    return row


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="memory,redis")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=10_000, help="calls per timed round")
    parser.add_argument("--count-calls", type=int, default=500,
                        help="calls in the counting passes (Python calls, allocations)")
    parser.add_argument("--unique", action="store_true",
                        help="a new client address (a new counter, no memo) on every call")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.calls, args.count_calls = 3, 1000, 50
    try:
        import uvloop
        loop_factory: Any = uvloop.new_event_loop
    except ImportError:
        loop_factory = asyncio.new_event_loop

    rows = []
    for store in args.stores.split(","):
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

    print(f"{'store':13} {'CPU µs/call min/median/max':>28} {'py calls':>9} {'objects':>8} "
          f"{'Redis cmds/decision':>20} {'failure-mode answers':>21}")
    for row in rows:
        cpu = row["cpu_us_per_call"]
        valid = "" if row["failure_mode_answers"] == 0 else "  INVALID"
        cmds = row["redis_commands_per_decision"]
        cmds_cell = "-" if cmds is None else f"{cmds:.3f}"
        print(f"{row['store']:13} {cpu['min']:8.1f} {cpu['median']:8.1f} {cpu['max']:8.1f}    "
              f"{row['python_calls_per_call']:9.1f} {row['gc_objects_per_call']:8.1f} "
              f"{cmds_cell:>20} {row['failure_mode_answers']:21.0f}{valid}")
    name = "handler_cpu_unique" if args.unique else "handler_cpu"
    write_results(name, {"rows": rows, "environment": environment()}, args.quick)


if __name__ == "__main__":
    main()
