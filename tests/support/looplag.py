"""Longest event-loop pause while a ConfigHolder watches N files, idle and during a reload.

Usage: python tests/support/looplag.py N SECONDS [gc]   (gc: also print gen-2 collections)
Not a test (no wall-clock assertions in tests): a figure for docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import tempfile
import time
from pathlib import Path

from rls.config.reload import ConfigHolder
from rls.observability.metrics import Metrics


def good(domain: str) -> str:
    return (
        f"domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit:\n"
        "      unit: minute\n      requests_per_unit: 5\n"
    )


async def worst_pause(seconds: float) -> float:
    worst, end = 0.0, time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        await asyncio.sleep(0.001)
        worst = max(worst, time.perf_counter() - start - 0.001)
    return worst


async def main(n: int, seconds: float) -> None:
    folder = Path(tempfile.mkdtemp())
    for i in range(n):
        (folder / f"f{i:05}.yaml").write_text(good(f"d{i}"))
    holder = ConfigHolder([str(folder)], Metrics())
    start = time.monotonic()
    holder.reload()
    print("initial load s", round(time.monotonic() - start, 2))
    holder.start(1.0)
    await asyncio.sleep(1)  # watcher set up
    cpu = time.process_time()
    await asyncio.sleep(3)
    print("idle CPU ms per second", round((time.process_time() - cpu) * 1000 / 3, 2))
    print("idle max loop pause ms", round(await worst_pause(3) * 1000, 2))
    (folder / "f00000.yaml").write_text(good("changed"))
    worst = await worst_pause(seconds)
    config = holder.current()
    print("during reload max loop pause ms", round(worst * 1000, 2),
          "reloaded", config is not None and "changed" in config.domains)
    await holder.stop()


def _report_gc(phase: str, info: dict[str, int]) -> None:
    if info["generation"] == 2:
        print("gc", phase, info, round(time.perf_counter(), 3))


if __name__ == "__main__":
    if len(sys.argv) > 3:
        gc.freeze()
        gc.callbacks.append(_report_gc)
    asyncio.run(main(int(sys.argv[1]), float(sys.argv[2])))
