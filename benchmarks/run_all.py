"""Run every benchmark in turn; each prints its tables and writes benchmarks/results/<name>.json.

    python benchmarks/run_all.py            # default sizes, about 10 minutes
    python benchmarks/run_all.py --quick    # smoke test of every script, about 2 minutes
    python benchmarks/run_all.py --only rls_throughput,redis_cost
    python benchmarks/run_all.py --install  # pip install -r benchmarks/requirements.txt first

Scripts run one after another (never two at once: they would measure each other). A failing
script is reported and the others still run; the exit code is 1 if any failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
SCRIPTS = (
    "cpu_per_call",
    "rls_throughput",
    "latency_at_load",
    "workers_scale",
    "engine_compare",
    "redis_cost",
    "redis_batch",
    "envoy_e2e",
    "counters_service",
    "soak",
    "profile_rls",
)
# Hard limit per script (seconds): every script bounds itself well below this.
LIMIT = {"soak": 60 * 60}
DEFAULT_LIMIT = 15 * 60


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="pass --quick to every script")
    parser.add_argument("--only", default="", help="comma list of scripts to run")
    parser.add_argument("--skip", default="", help="comma list of scripts to skip")
    parser.add_argument("--soak-minutes", type=float, default=None, help="soak.py --minutes")
    parser.add_argument("--install", action="store_true",
                        help="pip install -r benchmarks/requirements.txt first")
    args = parser.parse_args()

    only = [s for s in args.only.split(",") if s]
    skip = {s for s in args.skip.split(",") if s}
    unknown = (set(only) | skip) - set(SCRIPTS)
    if unknown:
        parser.error(f"unknown script(s) {sorted(unknown)}; known: {', '.join(SCRIPTS)}")
    chosen = [s for s in (only or SCRIPTS) if s not in skip]

    if args.install:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-r",
                        str(BENCH / "requirements.txt")], check=True)

    summary = []
    for name in chosen:
        cmd = [sys.executable, str(BENCH / f"{name}.py")]
        if args.quick:
            cmd.append("--quick")
        if name == "soak" and args.soak_minutes is not None and not args.quick:
            cmd += ["--minutes", str(args.soak_minutes)]
        print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.monotonic()
        try:
            rc = subprocess.run(cmd, timeout=LIMIT.get(name, DEFAULT_LIMIT)).returncode
        except subprocess.TimeoutExpired:
            rc = -1
            print(f"=== {name}: timed out", flush=True)
        elapsed = time.monotonic() - t0
        summary.append({"script": name, "exit": rc, "seconds": round(elapsed, 1)})
        print(f"=== {name}: exit {rc} after {elapsed:.0f} s", flush=True)

    print("\n| script | exit | seconds |\n|---|---|---|")
    for s in summary:
        print(f"| {s['script']} | {s['exit']} | {s['seconds']} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"run_all{'-quick' if args.quick else ''}.json"
    out.write_text(json.dumps({"quick": args.quick, "scripts": summary}, indent=2) + "\n")
    return 0 if all(s["exit"] == 0 for s in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
