"""Redis cost per decision: every rls algorithm next to envoyproxy/ratelimit, with targets.

Targets (issue 12 item 6), measured on one private redis-server, sequential calls, 1 and 3
descriptors (user+path, api+user, remote_address), steady state (100 users cycling, keys exist,
limit never reached):
- script time per decision (INFO commandstats usec of EVALSHA/FCALL over the decisions):
  <= 10 µs for a 1-descriptor fixed window;
- whole-server CPU per decision (INFO cpu used_cpu_sys + used_cpu_user: parsing, replies,
  syscalls and all) <= 1.5x envoyproxy/ratelimit's scheme on the same Redis: per descriptor
  `INCRBY key hits` + `EXPIRE key unit`, one pipeline per request, through the same asyncio
  redis-py client rls uses;
- sliding_log's whole-server CPU <= 2x a plain sorted-set log (per descriptor
  ZREMRANGEBYSCORE + ZCARD + ZADD in one pipeline).
Rounds alternate rls and the references so that load from other processes hits both alike:
CPU ratios are the median of per-round ratios; script µs is the best round (Redis counts a
script's wall time, so a script preempted by another process mid-call counts the wait), with
the median beside it. Every rls decision must be decided by Redis (no
failure-mode answer, else the run stops).

Also printed: the commands an rls script runs, alone in a script (no logic), against the same
reference (FLOOR_SCRIPTS: what the command set costs inside Lua); commands per decision (sent /
run inside the script) for allowed and over-limit requests (over limit: rls answers keys it
knows to be over from its local cache); bytes per
counter (`MEMORY USAGE key SAMPLES 0` after 1 and 100 hits); and Redis µs per decision of the
log-based algorithms with 10 … 5,000 entries already in the log (filled with ZADD), which
shows that a check no longer grows with the log.

    python benchmarks/redis_cost.py [--quick] [--decisions 200] [--rounds 7] [--no-pin]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

from _common import DESCRIPTORS, HIGH, start_redis, table, workdir, write_results

ALGORITHMS = ("fixed_window", "sliding_window", "sliding_log", "token_bucket", "leaky_bucket",
              "gcra", "concurrency")
DOMAIN = "gateway"
ONE = DESCRIPTORS[:1]
CLIENT_COMMANDS = {"evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro"}
IGNORED = ("info", "config", "ping", "script", "client", "hello", "memory", "flushall", "select",
           "command")


def config_text(domain: str, algorithm: str, limit: int, unit: str) -> str:
    rl = f"{{unit: {unit}, requests_per_unit: {limit}, algorithm: {algorithm}}}"
    return f"""\
domain: {domain}
descriptors:
  - key: user
    descriptors:
      - key: path
        rate_limit: {rl}
  - key: api
    value: items
    descriptors:
      - key: user
        rate_limit: {rl}
  - key: remote_address
    rate_limit: {rl}
"""


def commandstats(client: Any) -> dict[str, tuple[int, int]]:
    """command -> (calls, total µs) since CONFIG RESETSTAT."""
    info = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for k, v in info.items()}


def split_counts(stats: dict[str, tuple[int, int]], n: int
                 ) -> tuple[float, float, dict[str, float], float]:
    """(sent, inside, inside by command, Redis µs) per decision. Redis µs = time Redis spent
    executing the commands the client sent (a script's time includes what it runs)."""
    sent = sum(c for k, (c, _) in stats.items() if k in CLIENT_COMMANDS)
    usec = sum(u for k, (_, u) in stats.items() if k in CLIENT_COMMANDS)
    inside = {k: c / n for k, (c, _) in stats.items()
              if k not in CLIENT_COMMANDS and not k.startswith(IGNORED)}
    return sent / n, sum(inside.values()), inside, usec / n


def breakdown(inside: dict[str, float]) -> str:
    return " ".join(f"{k.upper()} x{v:.3g}" for k, v in sorted(inside.items(), key=lambda x: -x[1]))


async def rls_costs(url: str, client: Any, algorithm: str, n: int) -> list[dict[str, Any]]:
    from rls.config.loader import load_files
    from rls.engine.limiter import DescriptorIn, RateLimiter
    from rls.observability.metrics import Metrics
    from rls.settings import Settings
    from rls.stores.redis import RedisBackend

    rows = []
    cases = [("allowed", HIGH, "minute", True), ("over limit", 1, "hour", True)]
    settings_probe = Settings()
    if hasattr(settings_probe, "local_cache"):
        cases.append(("over, no local cache", 1, "hour", False))
    for case, limit, unit, local_cache in cases:
        config = load_files([("c.yaml", config_text(DOMAIN, algorithm, limit, unit))])
        # A generous deadline: a call answered by the failure mode would not reach Redis.
        settings = Settings(backend_timeout_ms=5000)
        if hasattr(settings, "local_cache"):
            settings.local_cache = local_cache
        backend = RedisBackend(url, timeout_ms=5000)
        await backend.start()
        metrics = Metrics()
        limiter = RateLimiter(lambda c=config: c, backend, settings, metrics)
        for label, descs in (("1 descriptor", ONE), ("3 descriptors", DESCRIPTORS)):
            client.flushall()
            users = [f"user{i}" for i in range(100)]

            def request(u: str, descs: tuple = descs) -> list[DescriptorIn]:
                return [DescriptorIn(tuple((k, u if k == "user" else v) for k, v in e))
                        for e in descs]

            # Steady state, not first hits: every key exists (and, over limit, every key is
            # already known to be over where rls caches that) before counting starts.
            for _ in range(2):
                for u in users:
                    await limiter.should_rate_limit(DOMAIN, request(u))
            client.config_resetstat()
            codes: dict[int, int] = {}
            for i in range(n):
                d = await limiter.should_rate_limit(DOMAIN, request(users[i % len(users)]))
                codes[d.overall] = codes.get(d.overall, 0) + 1
            expect = 1 if case == "allowed" else 2
            if codes != {expect: n}:  # (the first pass made every user over limit)
                raise RuntimeError(f"{algorithm} {case}: overall codes {codes}, expected {expect}")
            sent, inside, parts, usec = split_counts(commandstats(client), n)
            failed = sum(s.value for m in metrics.registry.collect() for s in m.samples
                         if s.name == "rls_backend_errors_total")
            if failed:
                raise RuntimeError(f"{algorithm} {case}: {failed:.0f} backend errors")
            rows.append({"scheme": f"rls {algorithm}", "case": case, "request": label,
                         "round_trips": sent, "sent": sent, "inside": inside,
                         "inside_breakdown": parts, "redis_us": round(usec, 1)})
        await backend.close()
    return rows


async def rls_bytes(url: str, client: Any, algorithm: str) -> dict[str, Any]:
    from rls.config.loader import load_files
    from rls.engine.limiter import DescriptorIn, RateLimiter
    from rls.observability.metrics import Metrics
    from rls.settings import Settings
    from rls.stores.redis import RedisBackend

    config = load_files([("c.yaml", config_text(DOMAIN, algorithm, HIGH, "minute"))])
    backend = RedisBackend(url, timeout_ms=5000)
    limiter = RateLimiter(lambda: config, backend, Settings(backend_timeout_ms=5000), Metrics())
    client.flushall()
    req = [DescriptorIn(ONE[0])]
    await limiter.should_rate_limit(DOMAIN, req)
    keys = [k.decode() for k in client.keys("*")]
    if len(keys) != 1:
        raise RuntimeError(f"{algorithm}: expected one counter key, found {keys}")
    key = keys[0]
    one = client.memory_usage(key, samples=0)
    for _ in range(99):
        await limiter.should_rate_limit(DOMAIN, req)
    hundred = client.memory_usage(key, samples=0)
    await backend.close()
    kind = client.type(key).decode()
    return {"scheme": f"rls {algorithm}", "key": key, "key_bytes": len(key.encode()),
            "value": repr(client.get(key)) if kind == "string" else kind,
            "bytes_1_hit": one, "bytes_100_hits": hundred}


async def log_scaling(url: str, client: Any, algorithm: str, sizes: tuple[int, ...],
                      n: int) -> list[dict[str, Any]]:
    """Redis µs per decision of a log-based algorithm against the entries already in the log.

    The log is filled directly with ZADD (members `<seq>:1`, scored now) so that large logs
    are quick to build; then `n` decisions are timed with commandstats.
    """
    from rls.config.loader import load_files
    from rls.engine.limiter import DescriptorIn, RateLimiter
    from rls.observability.metrics import Metrics
    from rls.settings import Settings
    from rls.stores.redis import RedisBackend

    config = load_files([("c.yaml", config_text(DOMAIN, algorithm, HIGH, "minute"))])
    backend = RedisBackend(url, timeout_ms=30_000)
    limiter = RateLimiter(lambda: config, backend, Settings(backend_timeout_ms=30_000),
                          Metrics())
    req = [DescriptorIn(ONE[0])]
    rows = []
    for size in sizes:
        client.flushall()
        await limiter.should_rate_limit(DOMAIN, req)
        (key,) = client.keys("*")
        sec, usec = client.time()
        now_ms = sec * 1000 + usec // 1000
        pipe = client.pipeline(transaction=False)
        for seq in range(10**6, 10**6 + size):
            pipe.zadd(key, {f"{seq}:1": now_ms})
        pipe.execute()
        await limiter.should_rate_limit(DOMAIN, req)  # a log in an earlier form is rewritten once
        client.config_resetstat()
        for _ in range(n):
            await limiter.should_rate_limit(DOMAIN, req)
        stats = commandstats(client)
        usec_total = sum(u for k, (_, u) in stats.items() if k in CLIENT_COMMANDS)
        rows.append({"algorithm": algorithm, "entries": size,
                     "redis_us_per_decision": round(usec_total / n, 1)})
    await backend.close()
    return rows


def reference_key(descriptor: tuple[tuple[str, str], ...], window_start: int) -> str:
    return "_".join([DOMAIN, *(f"{k}_{v}" for k, v in descriptor), str(window_start)])


def reference_costs(client: Any, n: int) -> list[dict[str, Any]]:
    """envoyproxy/ratelimit: INCRBY + EXPIRE per descriptor, one pipeline per request."""
    rows = []
    for label, descs in (("1 descriptor", ONE), ("3 descriptors", DESCRIPTORS)):
        client.flushall()
        client.config_resetstat()
        users = [f"user{i}" for i in range(100)]
        for i in range(n):
            u = users[i % len(users)]
            start = int(time.time()) // 60 * 60
            pipe = client.pipeline(transaction=False)
            for e in descs:
                key = reference_key(tuple((k, u if k == "user" else v) for k, v in e), start)
                pipe.incrby(key, 1)
                pipe.expire(key, 60)
            pipe.execute()
        stats = commandstats(client)
        sent = sum(c for k, (c, _) in stats.items() if not k.startswith(IGNORED)) / n
        usec = sum(u for k, (_, u) in stats.items() if not k.startswith(IGNORED)) / n
        rows.append({"scheme": "envoyproxy/ratelimit (INCRBY+EXPIRE)", "case": "any",
                     "request": label, "round_trips": 1.0, "sent": sent, "inside": 0.0,
                     "inside_breakdown": {}, "redis_us": round(usec, 1)})
    client.flushall()
    key = reference_key(ONE[0], int(time.time()) // 60 * 60)
    client.incrby(key, 1)
    client.expire(key, 60)
    one = client.memory_usage(key, samples=0)
    for _ in range(99):
        client.incrby(key, 1)
        client.expire(key, 60)
    hundred = client.memory_usage(key, samples=0)
    return [*rows, {"scheme": "envoyproxy/ratelimit", "key": key, "key_bytes": len(key),
                    "value": repr(client.get(key)), "bytes_1_hit": one,
                    "bytes_100_hits": hundred}]



# The commands an rls script runs, alone in a script (no Lua logic): what the command set costs
# inside Redis's Lua, next to what the same decision costs with rls's logic around it.
FLOOR_SCRIPTS = {
    "fixed_window": """
for i = 1, #KEYS do redis.call('INCRBY', KEYS[i], 1) end
return 1""",
    "sliding_log": """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
for i = 1, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - 60000)
  redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')
  redis.call('ZRANGE', KEYS[i], -1, -1, 'WITHSCORES')
  redis.call('ZADD', KEYS[i], now, now .. ':' .. ARGV[1])
end
return 1""",
}

SCRIPT_TARGET_US = 10.0  # fixed window, 1 descriptor
CPU_TARGET = 1.5  # x INCRBY+EXPIRE, 1 and 3 descriptors
LOG_TARGET = 2.0  # sliding_log x the ZREMRANGEBYSCORE + ZCARD + ZADD log


def server_cpu_s(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


async def timed_block(client: Any, n: int, one: Any) -> tuple[float, float]:
    """(server CPU µs, script µs) per call of `one(i)` over n calls."""
    client.config_resetstat()
    before = server_cpu_s(client)
    for i in range(n):
        await one(i)
    cpu = (server_cpu_s(client) - before) * 1e6 / n
    usec = sum(u for k, (_, u) in commandstats(client).items() if k in CLIENT_COMMANDS)
    return cpu, usec / n


async def target_costs(url: str, client: Any, n: int, rounds: int) -> list[dict[str, Any]]:
    """Script µs and whole-server CPU per decision for every algorithm, beside the references
    measured in the same rounds."""
    import redis.asyncio as aioredis

    from rls.config.loader import load_files
    from rls.engine.limiter import DescriptorIn, RateLimiter
    from rls.observability.metrics import Metrics
    from rls.settings import Settings
    from rls.stores.redis import RedisBackend

    plain = aioredis.Redis.from_url(url)
    rows = []
    users = [f"user{i}" for i in range(100)]
    for algorithm in ALGORITHMS:
        config = load_files([("c.yaml", config_text(DOMAIN, algorithm, HIGH, "minute"))])
        backend = RedisBackend(url, timeout_ms=5000)
        await backend.start()
        metrics = Metrics()
        limiter = RateLimiter(lambda c=config: c, backend, Settings(backend_timeout_ms=5000),
                              metrics)
        for label, descs in (("1 descriptor", ONE), ("3 descriptors", DESCRIPTORS)):
            client.flushall()

            def request(u: str, descs: tuple = descs) -> list[DescriptorIn]:
                return [DescriptorIn(tuple((k, u if k == "user" else v) for k, v in e))
                        for e in descs]

            async def rls_one(i: int, limiter: Any = limiter, algorithm: str = algorithm) -> None:
                d = await limiter.should_rate_limit(DOMAIN, request(users[i % len(users)]))
                if d.overall != 1:
                    raise RuntimeError(f"{algorithm}: a decision was not OK ({d.overall})")

            async def ref_one(i: int, descs: tuple = descs) -> None:
                u = users[i % len(users)]
                start = int(time.time()) // 60 * 60
                pipe = plain.pipeline(transaction=False)
                for e in descs:
                    key = reference_key(tuple((k, u if k == "user" else v) for k, v in e), start)
                    pipe.incrby(key, 1)
                    pipe.expire(key, 60)
                await pipe.execute()

            async def log_one(i: int, descs: tuple = descs) -> None:
                u = users[i % len(users)]
                now_ms = int(time.time() * 1000)
                pipe = plain.pipeline(transaction=False)
                for e in descs:
                    key = "zlog_" + reference_key(tuple((k, u if k == "user" else v)
                                                        for k, v in e), 0)
                    pipe.zremrangebyscore(key, "-inf", now_ms - 60_000)
                    pipe.zcard(key)
                    pipe.zadd(key, {f"{now_ms}:{i}": now_ms})
                await pipe.execute()

            floor_script = FLOOR_SCRIPTS.get(algorithm)
            floor_sha = client.script_load(floor_script) if floor_script else None

            async def floor_one(i: int, descs: tuple = descs, sha: Any = floor_sha) -> None:
                u = users[i % len(users)]
                keys = ["floor_" + reference_key(tuple((k, u if k == "user" else v)
                                                       for k, v in e), 0) for e in descs]
                await plain.evalsha(sha, len(keys), *keys, i)

            for i in range(2 * len(users)):  # steady state: every key exists
                await rls_one(i)
                await ref_one(i)
                await log_one(i)
                if floor_sha:
                    await floor_one(i)
            got: dict[str, list[float]] = {"cpu": [], "script": [], "ref": [], "log": [],
                                           "floor": []}
            for _ in range(rounds):
                cpu, script = await timed_block(client, n, rls_one)
                got["cpu"].append(cpu)
                got["script"].append(script)
                got["ref"].append((await timed_block(client, n, ref_one))[0])
                if algorithm in ("sliding_log", "concurrency"):
                    got["log"].append((await timed_block(client, n, log_one))[0])
                if floor_sha:
                    got["floor"].append((await timed_block(client, n, floor_one))[0])
            failed = sum(s.value for m in metrics.registry.collect() for s in m.samples
                         if s.name == "rls_backend_errors_total")
            if failed:
                raise RuntimeError(f"{algorithm}: {failed:.0f} decisions by the failure mode")
            # Script µs: the least-disturbed round (a script preempted mid-call counts its wait);
            # CPU ratios: the median of per-round ratios, each rls block beside its reference.
            row = {"algorithm": algorithm, "request": label,
                   "script_us": round(min(got["script"]), 1),
                   "script_us_median": round(median(got["script"]), 1),
                   "cpu_us": round(median(got["cpu"]), 1),
                   "ref_cpu_us": round(median(got["ref"]), 1),
                   "cpu_x_ref": round(median([a / b for a, b in zip(got["cpu"], got["ref"],
                                                                    strict=True)]), 2)}
            base = got["log"] or got["ref"]  # the reference each target compares with
            if got["floor"]:
                row["floor_cpu_us"] = round(median(got["floor"]), 1)
                row["floor_x"] = round(median([a / b for a, b in zip(got["floor"], base,
                                                                      strict=True)]), 2)
            if got["log"]:
                row["log_cpu_us"] = round(median(got["log"]), 1)
                row["cpu_x_log"] = round(median([a / b for a, b in zip(got["cpu"], got["log"],
                                                                       strict=True)]), 2)
            rows.append(row)
        await backend.close()
    await plain.aclose()
    return rows


def verdicts(rows: list[dict[str, Any]]) -> list[tuple[str, float, float, bool]]:
    """(target, measured, bound, met) for every target."""
    by = {(r["algorithm"], r["request"]): r for r in rows}
    out = []
    fw1 = by[("fixed_window", "1 descriptor")]
    out.append(("script µs/decision, fixed_window, 1 descriptor", fw1["script_us"],
                SCRIPT_TARGET_US, fw1["script_us"] <= SCRIPT_TARGET_US))
    for label in ("1 descriptor", "3 descriptors"):
        r = by[("fixed_window", label)]
        out.append((f"server CPU x INCRBY+EXPIRE, fixed_window, {label}", r["cpu_x_ref"],
                    CPU_TARGET, r["cpu_x_ref"] <= CPU_TARGET))
    for label in ("1 descriptor", "3 descriptors"):
        r = by[("sliding_log", label)]
        out.append((f"server CPU x ZCARD log, sliding_log, {label}", r["cpu_x_log"],
                    LOG_TARGET, r["cpu_x_log"] <= LOG_TARGET))
    return out

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few seconds: smoke test")
    parser.add_argument("--decisions", type=int, default=200, help="decisions per measurement")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per target figure")
    parser.add_argument("--no-pin", action="store_true",
                        help="do not pin redis-server and this process to separate cores")
    args = parser.parse_args()
    if args.quick:
        args.decisions, args.rounds = 150, 5

    d = workdir("redis-cost")
    redis = start_redis(d)
    client = redis.client()
    pinned = not args.no_pin and len(os.sched_getaffinity(0)) >= 2
    if pinned:
        # Redis on a core of its own, the benchmark's client on another: otherwise the client
        # preempts Redis mid-script, and commandstats counts that wait as script time.
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(redis.pid, {cores[-1]})
        os.sched_setaffinity(0, {cores[0]})

    async def collect() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        costs, sizes = [], []
        for algorithm in ALGORITHMS:
            costs += await rls_costs(redis.url, client, algorithm, args.decisions)
            sizes.append(await rls_bytes(redis.url, client, algorithm))
            print(f"measured {algorithm}", flush=True)
        return costs, sizes

    async def logs() -> list[dict[str, Any]]:
        sizes = (10, 100) if args.quick else (10, 100, 1000, 5000)
        out = []
        for algorithm in ("sliding_log", "concurrency"):
            out += await log_scaling(redis.url, client, algorithm, sizes, 20 if args.quick
                                     else 50)
        return out

    targets = asyncio.run(target_costs(redis.url, client, args.decisions, args.rounds))
    costs, sizes = asyncio.run(collect())
    scaling = asyncio.run(logs())
    ref = reference_costs(client, args.decisions)
    costs += [r for r in ref if "case" in r]
    sizes += [r for r in ref if "key" in r]

    print()
    t0 = table(["algorithm", "request", "script µs best", "median", "server CPU µs",
                "INCRBY+EXPIRE CPU µs", "x INCRBY+EXPIRE", "ZCARD log CPU µs", "x ZCARD log",
                "its commands alone, x"],
               [[r["algorithm"], r["request"], r["script_us"], r["script_us_median"],
                 r["cpu_us"], r["ref_cpu_us"], r["cpu_x_ref"], r.get("log_cpu_us"),
                 r.get("cpu_x_log"), r.get("floor_x")] for r in targets],
               f"Redis cost per decision ({args.rounds} rounds of {args.decisions} sequential "
               "decisions; script µs = EVALSHA usec per decision, best round and median; "
               "server CPU = INFO cpu, medians; x = median of per-round ratios; "
               "its commands alone = the commands the rls script runs, in a script without "
               "its logic, x the same reference; "
               f"load average {os.getloadavg()[0]:.1f}; "
               f"{'Redis and client pinned to separate cores' if pinned else 'not pinned'})")
    checks = verdicts(targets)
    lines = [f"{'PASS' if met else 'FAIL'}  {name}: {value:g} (target <= {bound:g})"
             for name, value, bound, met in checks]
    print("\n".join(lines))
    t0 += "\n\n" + "\n".join(lines)
    print()
    rows = [[c["scheme"], c["case"], c["request"], c["round_trips"], c["sent"], c["inside"],
             c["redis_us"], breakdown(c["inside_breakdown"]) or "-"] for c in costs]
    t1 = table(["scheme", "case", "request", "round trips", "sent", "inside scripts",
                "redis µs", "inside, per decision"], rows,
               f"Redis commands per decision (INFO commandstats, {args.decisions} decisions each)")
    print()
    rows2 = [[s["scheme"], s["key"], s["key_bytes"], s["bytes_1_hit"], s["bytes_100_hits"]]
             for s in sizes]
    t2 = table(["scheme", "key", "key bytes", "MEMORY USAGE 1 hit", "100 hits"], rows2,
               "Bytes per counter (MEMORY USAGE key SAMPLES 0, Redis "
               f"{client.info('server')['redis_version']})")
    print()
    by_size: dict[int, dict[str, float]] = {}
    for r in scaling:
        by_size.setdefault(r["entries"], {})[r["algorithm"]] = r["redis_us_per_decision"]
    t3 = table(["entries in the log", "sliding_log redis µs", "concurrency redis µs"],
               [[k, v.get("sliding_log"), v.get("concurrency")] for k, v in by_size.items()],
               "Log-based algorithms: Redis µs per decision vs entries in the window "
               "(1 descriptor)")
    write_results("redis_cost", {"params": {**vars(args), "pinned": pinned}, "targets": targets,
                                 "verdicts": [{"target": n, "measured": v, "bound": b, "met": m}
                                              for n, v, b, m in checks],
                                 "commands": costs, "memory": sizes, "log_scaling": scaling},
                  args.quick, [t0, t1, t2, t3])
    redis.stop()


if __name__ == "__main__":
    main()
