"""RSS of the in-memory counter store under distinct keys, with and without its byte bound.

    python benchmarks/memory_store_rss.py [--keys 1000000] [--max-bytes 67108864] [--key-extra 0]
    python benchmarks/memory_store_rss.py --decide-cost

One process, no server: N distinct fixed-window hourly keys (~30 characters, plus --key-extra)
are decided through `MemoryBackend.decide_now`, then the growth of this process's RSS, the
counters kept, the evictions and the CPU per decision are printed. `--max-bytes 0` leaves the
store unbounded (a huge bound) to compare. Takes ~10 s per million keys on one core.
`--decide-cost`: instead, the CPU of one single-check decision on 1,000 live keys (best of 400
passes), charged and denied, below and above half the bound (where denied checks start to
keep the recency order).
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

from rls.config.model import Limit, Unit
from rls.core.model import Check
from rls.stores.memory import DEFAULT_MAX_BYTES, MemoryBackend


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def decide_cost() -> None:
    now = int(time.time() * 1000)
    for rpu, what in ((10**9, "charged"), (1, "denied")):
        limit = Limit(rpu, Unit.HOUR)
        checks = [[Check(0, limit, f"rl:api_user_{i}_1764432000", 1)] for i in range(1000)]
        for label, bound in (("below half the bound", DEFAULT_MAX_BYTES), ("above", 500_000)):
            store = MemoryBackend(sweep_interval=0, max_bytes=bound)
            for one in checks:
                store.decide_now(one, now)
            best = float("inf")
            for _ in range(400):
                start = time.perf_counter()
                for one in checks:
                    store.decide_now(one, now)
                best = min(best, (time.perf_counter() - start) / len(checks))
            print(f"{what:8} {label:22} {best * 1e6:.3f} µs per decide_now")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES)
    parser.add_argument("--key-extra", type=int, default=0, help="characters added to each key")
    parser.add_argument("--decide-cost", action="store_true", help="CPU per decision instead")
    args = parser.parse_args()
    if args.decide_cost:
        decide_cost()
        return
    bound = args.max_bytes or 1 << 62
    store = MemoryBackend(sweep_interval=0, max_bytes=bound)
    limit = Limit(100, Unit.HOUR)
    now = int(time.time() * 1000)
    extra = "x" * args.key_extra
    gc.collect()
    before = rss()
    cpu = time.process_time()
    for i in range(args.keys):
        store.decide_now([Check(0, limit, f"rl:api_{i % 7}_user_{i}_1764432000{extra}", 1)], now)
    cpu = time.process_time() - cpu
    gc.collect()
    grown = rss() - before
    print(
        f"keys {args.keys:,}  bound {'none' if not args.max_bytes else f'{bound:,} B'}  "
        f"kept {len(store):,}  estimate {store.nbytes:,} B  evictions {store.evictions:,}  "
        f"RSS +{grown / 2**20:.0f} MB ({grown / max(len(store), 1):.0f} B per kept counter)  "
        f"CPU {cpu / args.keys * 1e6:.2f} µs per decision"
    )


if __name__ == "__main__":
    main()
