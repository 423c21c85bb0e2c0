"""Engine decisions/s on one core: rls's engine vs `limits` and `throttled-py`, same Redis.

Everything runs in this one Python process, pinned to one CPU (`--no-pin` to disable), against
one private redis-server. Per algorithm, each implementation decides one descriptor per call
(a user id cycling over 1,000 values, limit 10^9 per minute so nothing is ever denied):

- rls: `rls.engine.limiter.RateLimiter` with `rls.stores.redis.RedisBackend` — the full
  engine path of a ShouldRateLimit call (match, key, one EVALSHA, statuses, metrics);
- limits (alisaifee): `limits.aio.strategies.<Strategy>(RedisStorage).hit(item, "bench", user)`
  with both async clients it supports (coredis, its default, and redis-py);
- throttled-py: `throttled.asyncio.Throttled(using=..., store=RedisStore).limit(user)`.

Modes: `sequential` (one call at a time: latency-bound) and `concurrent` (`--tasks` asyncio
tasks sharing the client). Reported: decisions/s (median of rounds), rls / best library (by
decisions/s), and for rls and that best library the CPU µs per decision of this process
(process CPU time / decisions: the cost on the one core) and of redis-server (INFO cpu). Algorithms
without an equivalent in a library are left blank there. performance target: rls >= 2x the best
library on the same algorithm.

rls's engine runs with its production defaults (Settings(), RedisBackend's default deadline).
Every rls figure carries the decisions answered by the failure mode during its measurement
(rls_failure_mode_answers_total of the engine's own metrics registry): a figure with any is
marked INVALID (a fail-open answer is not a decision) and fails the target.

Install the libraries first: pip install -r benchmarks/requirements.txt

    python benchmarks/engine_compare.py [--quick] [--duration 1.5] [--tasks 16] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from _common import (
    HIGH,
    FailureModeAnswers,
    median,
    print_targets,
    start_redis,
    table,
    target_result,
    workdir,
    write_results,
)

Decide = Callable[[str], Awaitable[bool]]  # user -> allowed?
# (decide, close, failure-mode answers so far: rls only)
Impl = tuple[Decide, Callable[[], Awaitable[None]], Callable[[], float] | None]

# name -> (rls algorithm, limits strategy class name, throttled RateLimiterType value)
ALGORITHMS: dict[str, tuple[str, str | None, str | None]] = {
    "fixed_window": ("fixed_window", "FixedWindowRateLimiter", "fixed_window"),
    "sliding_window": ("sliding_window", "SlidingWindowCounterRateLimiter", "sliding_window"),
    "token_bucket": ("token_bucket", None, "token_bucket"),
    "gcra": ("gcra", None, "gcra"),
    "leaky_bucket": ("leaky_bucket", None, "leaking_bucket"),
    "sliding_log (exact)": ("sliding_log", "MovingWindowRateLimiter", None),
}
CORE = ("fixed_window", "sliding_window", "token_bucket")
USERS = [f"user{i}" for i in range(1000)]


async def make_rls(url: str, algorithm: str) -> Impl:
    from rls.config.loader import load_files
    from rls.engine.limiter import OK, DescriptorIn, RateLimiter
    from rls.observability.metrics import Metrics
    from rls.settings import Settings
    from rls.stores.redis import RedisBackend

    domain = f"engine_{algorithm}"
    text = (f"domain: {domain}\ndescriptors:\n  - key: user\n    rate_limit: "
            f"{{unit: minute, requests_per_unit: {HIGH}, algorithm: {algorithm}}}\n")
    config = load_files([(f"{domain}.yaml", text)])
    settings = Settings()  # production defaults: a missed deadline is a failure-mode answer
    metrics = Metrics()
    backend = RedisBackend(url)
    await backend.start()
    limiter = RateLimiter(lambda: config, backend, settings, metrics)

    async def decide(user: str) -> bool:
        d = await limiter.should_rate_limit(domain, [DescriptorIn((("user", user),))])
        return d.overall == OK

    async def close() -> None:
        await backend.close()

    def failure_answers() -> float:
        return sum(s.value for m in metrics.registry.collect() for s in m.samples
                   if s.name == "rls_failure_mode_answers_total")

    return decide, close, failure_answers


async def make_limits(url: str, strategy: str, implementation: str) -> Impl:
    from limits import RateLimitItemPerMinute
    from limits.aio import strategies
    from limits.aio.storage import RedisStorage

    storage = RedisStorage("async+" + url, implementation=implementation)
    limiter = getattr(strategies, strategy)(storage)
    item = RateLimitItemPerMinute(HIGH)

    async def decide(user: str) -> bool:
        return await limiter.hit(item, "bench", user)

    async def close() -> None:
        pass

    return decide, close, None


async def make_throttled(url: str, using: str) -> Impl:
    from throttled.asyncio import RedisStore, Throttled, per_min

    store = RedisStore(server=url)
    throttle = Throttled(using=using, quota=per_min(HIGH), store=store)

    async def decide(user: str) -> bool:
        return not (await throttle.limit(user)).limited

    async def close() -> None:
        pass

    return decide, close, None


def redis_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def measure(decide: Decide, tasks: int, duration: float, max_calls: int,
                  client: Any, failures: Callable[[], float] | None = None) -> dict[str, Any]:
    done = denied = 0
    deadline = time.perf_counter() + duration

    async def worker(offset: int) -> None:
        nonlocal done, denied
        i = offset
        while done < max_calls and time.perf_counter() < deadline:
            if not await decide(USERS[i % len(USERS)]):
                denied += 1
            i += 1
            done += 1

    fm0 = failures() if failures else 0.0
    rcpu0 = redis_cpu(client)
    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(k * 97) for k in range(tasks)))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    rcpu = redis_cpu(client) - rcpu0
    fm = round(failures() - fm0) if failures else None
    if denied and not fm:
        raise RuntimeError(f"{denied} of {done} decisions were denied (limit {HIGH})")
    return {"decisions": done, "seconds": round(elapsed, 3), "rate": done / elapsed,
            "cpu_us_per_decision": cpu / done * 1e6,
            "redis_cpu_us_per_decision": rcpu / done * 1e6, "failure_mode_answers": fm}


def implementations(name: str, url: str) -> list[tuple[str, Callable[[], Awaitable[Impl]]]]:
    rls_algo, strategy, using = ALGORITHMS[name]
    out: list[tuple[str, Callable[[], Awaitable[Impl]]]] = [
        ("rls", lambda: make_rls(url, rls_algo))]
    if strategy:
        out.append(("limits (coredis)", lambda: make_limits(url, strategy, "coredis")))
        out.append(("limits (redis-py)", lambda: make_limits(url, strategy, "redispy")))
    if using:
        out.append(("throttled-py", lambda: make_throttled(url, using)))
    return out


async def run(args: argparse.Namespace, redis: Any) -> list[dict[str, Any]]:
    names = CORE if args.quick else tuple(ALGORITHMS)
    modes = [("sequential", 1), ("concurrent", args.tasks)]
    client = redis.client()
    results: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in range(args.rounds):
        for name in names:
            for impl, factory in implementations(name, redis.url):
                client.flushall()
                decide, close, failures = await factory()
                for _ in range(100):  # warm-up: scripts loaded, connections open
                    await decide(USERS[0])
                await measure(decide, args.tasks, 0.2, 10_000, client)
                for mode, tasks in modes:
                    res = await measure(decide, tasks, args.duration, args.max_calls, client,
                                        failures)
                    results.setdefault((name, mode, impl), []).append(res)
                    print(f"round {r + 1}: {name:<20} {mode:<10} {impl:<18} "
                          f"{res['rate']:9.0f} decisions/s  {res['cpu_us_per_decision']:6.0f} "
                          f"µs CPU/decision  redis {res['redis_cpu_us_per_decision']:5.0f} µs"
                          + ("" if res["failure_mode_answers"] is None else
                             f"  failure-mode answers {res['failure_mode_answers']}"),
                          flush=True)
                await close()
    out = []
    for (name, mode, impl), rs in results.items():
        out.append({"algorithm": name, "mode": mode, "implementation": impl,
                    "decisions_per_s": round(median([x["rate"] for x in rs]), 1),
                    "cpu_us_per_decision": round(median([x["cpu_us_per_decision"] for x in rs]), 1),
                    "redis_cpu_us_per_decision": round(
                        median([x["redis_cpu_us_per_decision"] for x in rs]), 1),
                    **({} if rs[0]["failure_mode_answers"] is None else {
                        "failure_mode_answers": sum(x["failure_mode_answers"] for x in rs),
                        "valid": not any(x["failure_mode_answers"] for x in rs)}),
                    "runs": rs})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few seconds: smoke test")
    parser.add_argument("--duration", type=float, default=1.5, help="seconds per measurement")
    parser.add_argument("--max-calls", type=int, default=200_000, help="cap per measurement")
    parser.add_argument("--tasks", type=int, default=16, help="tasks in the concurrent mode")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--no-pin", action="store_true", help="do not pin to one CPU")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.rounds = 0.3, 1

    pinned = None
    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        pinned = max(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {pinned})
    d = workdir("engine")
    redis = start_redis(d)
    out = asyncio.run(run(args, redis))

    by = {(e["algorithm"], e["mode"], e["implementation"]): e for e in out}
    impls = ["rls", "limits (coredis)", "limits (redis-py)", "throttled-py"]
    rows = []
    ratios = {}
    targets = []
    for name in dict.fromkeys(e["algorithm"] for e in out):
        for mode in ("sequential", "concurrent"):
            cells = [by.get((name, mode, i)) for i in impls]
            libs = [c["decisions_per_s"] for c in cells[1:] if c]
            rls = cells[0]["decisions_per_s"]
            ratio = rls / max(libs) if libs else float("nan")
            ratios[f"{name}/{mode}"] = None if not libs else round(ratio, 2)
            best = max((c for c in cells[1:] if c), key=lambda c: c["decisions_per_s"],
                       default=None)
            rows.append([name, mode, *[c["decisions_per_s"] if c else None for c in cells],
                         "-" if not libs else f"{ratio:.2f}",
                         cells[0]["cpu_us_per_decision"],
                         best["cpu_us_per_decision"] if best else None,
                         cells[0]["redis_cpu_us_per_decision"],
                         best["redis_cpu_us_per_decision"] if best else None,
                         cells[0]["failure_mode_answers"],
                         "yes" if cells[0]["valid"] else "INVALID"])
            if libs:
                targets.append(target_result(
                    f"{name}/{mode}: rls >= 2 x best library", round(ratio, 2), ratio >= 2,
                    FailureModeAnswers(cells[0]["failure_mode_answers"])))
    where = f" pinned to CPU {pinned}" if pinned is not None else ""
    title = (f"Engine decisions/s, one process{where}"
             f", one descriptor, same redis-server; {args.duration:g} s per cell, "
             f"concurrent = {args.tasks} tasks")
    text = table(["algorithm", "mode", "rls", "limits coredis", "limits redis-py", "throttled-py",
                  "rls / best lib", "rls CPU µs", "best lib CPU µs", "rls redis µs",
                  "best lib redis µs", "rls failure-mode answers", "rls valid"], rows, title)
    text2 = print_targets(targets)
    write_results("engine_compare", {"params": vars(args), "pinned_cpu": pinned,
                                     "results": out, "ratio_rls_to_best_library": ratios,
                                     "target_results": targets},
                  args.quick, [text, text2])
    redis.stop()


if __name__ == "__main__":
    main()
