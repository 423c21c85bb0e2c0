"""CPU per BatchAdd of the Redis counters store, in process (no gRPC, no load tool).

`RedisCounterStore.run("a", 30 items)` from 100 concurrent tasks for `--seconds`, `--rounds`
times, on a redis-server of its own: batches/s and this process's CPU µs per batch. Run it
from another checkout to compare (the store took the Redis client before rls/stores/redis/,
the store since; both are handled):

    python benchmarks/counters_store_cpu.py
    (cd /tmp/base && PYTHONPATH=/tmp/base python /path/to/benchmarks/counters_store_cpu.py)
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import start_redis

from rls.frequency.model import CountersConfig, make_item
from rls.frequency.storage import RedisCounterStore
from rls.stores.redis import RedisBackend

CHECKOUT = Path(inspect.getfile(RedisCounterStore)).parents[2].name  # whose code runs


async def measure(seconds: float, rounds: int, callers: int) -> None:
    server = start_redis()
    try:
        backend = RedisBackend(server.url)
        await backend.start()
        first = next(iter(inspect.signature(RedisCounterStore).parameters))
        store: Any = (RedisCounterStore(backend) if first == "backend"
                      else RedisCounterStore(backend.client, breaker=backend.breaker))
        items = [make_item(CountersConfig(), "d", f"k{i}", 1, "day") for i in range(30)]

        async def caller(stop: float) -> int:
            done = 0
            while time.monotonic() < stop:
                await store.run("a", items)
                done += 1
            return done

        for _ in range(rounds):
            cpu, stop = time.process_time(), time.monotonic() + seconds
            done = sum(await asyncio.gather(*(caller(stop) for _ in range(callers))))
            cpu = time.process_time() - cpu
            print(f"{CHECKOUT}: {done / seconds:,.0f} batches/s ({done * 30 / seconds:,.0f} "
                  f"items/s), {cpu / done * 1e6:.0f} CPU µs per batch", flush=True)
        await backend.close()
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--callers", type=int, default=100)
    args = parser.parse_args()
    asyncio.run(measure(args.seconds, args.rounds, args.callers))


if __name__ == "__main__":
    main()
