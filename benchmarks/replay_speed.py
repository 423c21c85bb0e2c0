"""How fast `rls replay` decides a log of plain fixed windows (docs/performance.md).

Generates a decision log (rls's own `--decision-log` format) of N requests from many callers,
each with the three descriptors of the gateway (user+path, api+user, remote_address; some
callers over their limits), then replays it in this process and reports decisions per CPU
second of the replay (the target: >= 200,000 per core), for the fast path and, on a slice,
for the service's general engine. Bounded: --requests (default 1,000,000; --quick 100,000).

    python benchmarks/replay_speed.py [--requests N] [--quick] [--gzip]
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rls.cli.replay import _parser, run  # noqa: E402
from rls.engine.decision import DescriptorIn  # noqa: E402
from rls.engine.decision_log import line  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CONFIG = """\
domain: gateway
descriptors:
  - key: user
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 600}
  - key: api
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 20}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3000}
"""
TARGET = 200_000
START_MS = 1_767_225_600_000


def write_log(path: Path, requests: int, compress: bool, seed: int = 1, callers: int = 2000,
              paths: int = 5) -> None:
    """`requests` lines, about 1,300 a second, from `callers` callers on `paths` paths (20
    callers send 30 % of the requests: they go over their limits)."""
    rng = random.Random(seed)
    users = [f"user{i}" for i in range(callers)]
    hot = users[:20]
    routes = [f"/items/{i}" for i in range(paths)]
    opener: Any = gzip.open if compress else open
    ts = START_MS
    with opener(path, "wt", encoding="utf-8") as out:
        for _ in range(requests):
            ts += rng.choice((0, 0, 1))
            user = rng.choice(hot) if rng.random() < 0.3 else rng.choice(users)
            descs = (
                DescriptorIn((("user", user), ("path", rng.choice(routes)))),
                DescriptorIn((("api", "items"), ("user", user))),
                DescriptorIn((("remote_address", f"10.0.{hash(user) % 250}.1"),)),
            )
            out.write(line(ts, "OK", "gateway", descs, 0) + "\n")


def measure(config: Path, log: Path, general: bool) -> dict[str, Any]:
    args = _parser("replay_speed").parse_args(
        ["--config", str(config), "--log", str(log)] + (["--general-engine"] if general else [])
    )
    status, report, error = run(args)
    assert report is not None and status == 0, error
    return report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=1_000_000)
    p.add_argument("--quick", action="store_true", help="100,000 requests")
    p.add_argument("--gzip", action="store_true", help="a gzipped log")
    p.add_argument("--callers", type=int, default=2000, help="distinct users (default 2000)")
    p.add_argument("--paths", type=int, default=5, help="distinct paths (default 5)")
    args = p.parse_args()
    n = 100_000 if args.quick else args.requests
    with tempfile.TemporaryDirectory(prefix="rls-replay-bench-") as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(CONFIG)
        log = Path(tmp) / ("log.jsonl.gz" if args.gzip else "log.jsonl")
        started = time.perf_counter()
        write_log(log, n, args.gzip, callers=args.callers, paths=args.paths)
        print(f"wrote {n:,} lines ({log.stat().st_size / 1e6:.1f} MB) in "
              f"{time.perf_counter() - started:.1f} s")
        fast = measure(config, log, general=False)
        slice_log = Path(tmp) / "slice.jsonl"
        write_log(slice_log, min(n, 50_000), False)
        general = measure(config, slice_log, general=True)
        general_fast = measure(config, slice_log, general=False)
    same = general["limited"] == general_fast["limited"]
    rate = fast["decisions_per_cpu_second"]
    result = {
        "requests": n,
        "gzip": args.gzip,
        "callers": args.callers,
        "paths": args.paths,
        "fast_path_decisions_per_cpu_second": rate,
        "fast_path_wall_seconds": fast["seconds"],
        "over_limit_percent": fast["over_limit_percent"],
        "general_engine_decisions_per_cpu_second": general["decisions_per_cpu_second"],
        "fast_equals_general_on_slice": same,
        "target": TARGET,
        "passed": bool(rate and rate >= TARGET and same),
    }
    print(json.dumps(result, indent=1))
    RESULTS.mkdir(exist_ok=True)
    name = "replay_speed-quick.json" if args.quick else "replay_speed.json"
    (RESULTS / name).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
