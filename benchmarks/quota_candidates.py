"""What candidate limits cost an RLQS stream: CPU per bucket of a periodic usage report.

In this process, a quota stream holding `--buckets` buckets is handed the same periodic report
again and again (each bucket: 3 allowed, 1 denied), on the memory store and on a private
redis-server; variants: the limit without candidates, with 1 and with 3 candidates. Rounds
alternate between the variants; reported: the median process CPU per bucket of a report (rls's
side: the Redis server's CPU is not in it), and its ratio to the variant without candidates.

    python benchmarks/quota_candidates.py [--buckets 2000] [--rounds 9] [--quick]

Run it at two revisions (PYTHONPATH=<a worktree of the other one>) to compare the variant
without candidates: that is the cost of the feature when it is absent.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from _common import start_redis, table, workdir, write_results
from envoy.service.rate_limit_quota.v3 import rlqs_pb2
from prometheus_client import CollectorRegistry

from rls.config.loader import load_files
from rls.engine.top import TopTalkers
from rls.observability.metrics import Metrics
from rls.services.quota import QuotaService, QuotaStream
from rls.settings import Settings
from rls.stores.base import Backend
from rls.stores.memory import MemoryBackend

CANDIDATES = ["{name: c1, requests_per_unit: 500}", "{name: c2, requests_per_unit: 100}",
              "{name: c3, requests_per_unit: 50, algorithm: sliding_window}"]


def config(candidates: int, domain: str) -> str:
    text = (f"domain: {domain}\ndescriptors:\n  - key: client\n"
            "    rate_limit: {unit: hour, requests_per_unit: 1000000}\n")
    if candidates:
        text += f"    candidates: [{', '.join(CANDIDATES[:candidates])}]\n"
    return text


def report(domain: str, buckets: int) -> rlqs_pb2.RateLimitQuotaUsageReports:
    message = rlqs_pb2.RateLimitQuotaUsageReports(domain=domain)
    for i in range(buckets):
        usage = message.bucket_quota_usages.add()
        usage.bucket_id.bucket["client"] = f"c{i}"
        usage.num_requests_allowed = 3
        usage.num_requests_denied = 1
        usage.time_elapsed.seconds = 5
    return message


def stream(store: Backend, candidates: int, domain: str) -> QuotaStream:
    loaded = load_files([("q.yaml", config(candidates, domain))])
    reporter = None
    try:
        from rls.engine.candidates import CandidateReporter  # absent before the feature

        reporter = CandidateReporter(Metrics(CollectorRegistry()), TopTalkers(), 0.8)
    except ImportError:
        pass
    kwargs = {"candidates": reporter} if reporter is not None else {}
    service = QuotaService(lambda: loaded, store, Settings(), CollectorRegistry(), **kwargs)
    # Streams take the service's context; before rls/quota/context.py, the service itself.
    return QuotaStream(getattr(service, "context", service))


async def cpu_per_bucket(session: QuotaStream, message: object, buckets: int) -> float:
    start = time.process_time()
    await session.handle(message)
    session._out.drop()
    return (time.process_time() - start) / buckets * 1e6


def failure_answers(session: QuotaStream) -> int:
    """Buckets answered with the failure mode (the store failed or was too slow)."""
    return int(session.metrics.errors.labels("backend")._value.get())


async def measure(store: Backend, buckets: int, rounds: int) -> dict[int, tuple[float, int]]:
    """(median CPU µs per bucket of a report, failure-mode answers) per number of
    candidates."""
    variants = {}
    for n in (0, 1, 3):
        domain = f"qc{n}x{int(time.time())}"
        variants[n] = (stream(store, n, domain), report(domain, buckets))
        await variants[n][0].handle(variants[n][1])  # the buckets' first report
        variants[n][0]._out.drop()
    samples: dict[int, list[float]] = {n: [] for n in variants}
    for _ in range(rounds):
        for n, (session, message) in variants.items():
            samples[n].append(await cpu_per_bucket(session, message, buckets))
    return {
        n: (statistics.median(values), failure_answers(variants[n][0]))
        for n, values in samples.items()
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--buckets", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="smoke test: 200 buckets, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.buckets, args.rounds = 200, 2
    from rls.stores.redis import RedisBackend

    redis = start_redis(workdir("quota-candidates"))
    results: dict[str, Any] = {}
    rows = []
    try:
        for name in ("memory", "redis"):
            store: Backend = (
                MemoryBackend(sweep_interval=0) if name == "memory"
                else RedisBackend(f"redis://127.0.0.1:{redis.port}/0", timeout_ms=5000)
            )
            if isinstance(store, RedisBackend):
                await store.start()
            try:
                medians = await measure(store, args.buckets, args.rounds)
            finally:
                if isinstance(store, RedisBackend):
                    await store.close()
            results[name] = medians
            base = medians[0][0]
            rows += [[name, n, f"{us:.1f}", f"{us / base:.2f}", failed]
                     for n, (us, failed) in medians.items()]
    finally:
        redis.stop()
    text = table(["store", "candidates per limit", "CPU µs per bucket report", "x none",
                  "failure-mode answers"], rows,
                 f"{args.buckets} buckets per report, median of {args.rounds} rounds")
    print(text)
    write_results("quota_candidates", {"params": vars(args), "results": results}, args.quick,
                  [text])


if __name__ == "__main__":
    asyncio.run(main())
