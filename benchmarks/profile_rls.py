"""Profile `rls serve` under h2load load with py-spy; summarise the functions by own time.

Starts rls (memory backend by default, `--backend redis` for Redis), drives it with h2load
(the 3-descriptor request, closed loop) and records `--duration` seconds with
`py-spy record --format raw` (collapsed stacks; `--native` adds the C frames of grpc and
protobuf where py-spy can unwind them). Writes to benchmarks/results/:

- profile-<backend>.collapsed  the raw stacks (feed to flamegraph.pl or speedscope.app);
- profile-<backend>-top.txt    top functions by own time (leaf samples) and by total time
                               (samples whose stack contains the function), in % of samples;
- profile-<backend>.svg        a flame graph, with `--svg` (a second, separate recording);
(`profile-<backend>-native*` with `--native`).

rls runs with its production defaults (`--rls-arg` adds `rls serve` arguments). The req/s
h2load reached during each recording is printed with the calls answered by the failure mode
during that load (rls's /metrics scraped before and after it): a profile of a run with any
(marked INVALID) shows fail-open answers, not decisions.

    python benchmarks/profile_rls.py [--quick] [--duration 10] [--backend memory] [--native]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _common import (
    METHOD,
    RESULTS,
    ROOT,
    check_grpc_ok,
    failure_mode_answers,
    h2load_binary,
    request_bytes,
    start_redis,
    start_rls,
    validity,
    workdir,
    write_config,
    write_frame,
    write_results,
)

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: pip install -r benchmarks/requirements.txt")
    return found


def short(path: str) -> str:
    """py-spy already shortens most paths (module-relative); trim the rest."""
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1]
    if not os.path.isabs(path):
        return path
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return path


def name_of(frame: str) -> str:
    m = FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    return f"{m.group('func')} ({short(m.group('file'))})"


Ranked = list[tuple[str, int]]


def summarise(collapsed: str, top: int) -> tuple[str, int, Ranked, Ranked]:
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [name_of(f) for f in stack.split(";") if f]
        if not frames:
            continue
        samples += n
        own[frames[-1]] += n
        for f in set(frames):
            total[f] += n
    lines = [f"py-spy samples: {samples}", "", f"Top {top} by own time (leaf frame):",
             f"{'own %':>7}  {'total %':>7}  function (file)"]
    top_own = own.most_common(top)
    for f, n in top_own:
        lines.append(f"{n / samples * 100:7.2f}  {total[f] / samples * 100:7.2f}  {f}")
    lines += ["", f"Top {top} by total time (on the stack):",
              f"{'total %':>7}  {'own %':>7}  function (file)"]
    top_total = total.most_common(top)
    for f, n in top_total:
        lines.append(f"{n / samples * 100:7.2f}  {own[f] / samples * 100:7.2f}  {f}")
    return "\n".join(lines), samples, top_own, top_total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few seconds: smoke test")
    parser.add_argument("--duration", type=int, default=10, help="seconds recorded")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--backend", choices=("memory", "redis"), default="memory")
    parser.add_argument("--native", action="store_true", help="py-spy --native (C frames)")
    parser.add_argument("--svg", action="store_true", help="also record a flame graph SVG")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--rls-arg", action="append", default=[], metavar="ARG",
                        help="extra `rls serve` argument, repeatable; default: none")
    args = parser.parse_args()
    if args.quick:
        args.duration = 2

    d = workdir("profile")
    cfg = write_config(d / "config")
    redis_url = None
    if args.backend == "redis":
        redis_url = start_redis(d).url
    rls = start_rls(cfg, d, redis_url=redis_url, name=f"rls-{args.backend}",
                    extra=args.rls_arg)
    req = request_bytes("bench")
    check_grpc_ok(rls.grpc_addr, req, 1)
    body = write_frame(d / "req.bin", req)
    RESULTS.mkdir(parents=True, exist_ok=True)
    base = f"profile-{args.backend}{'-native' if args.native else ''}"
    if args.quick:  # keep a default-size profile from being overwritten by a smoke test
        base += "-quick"
    collapsed = RESULTS / f"{base}.collapsed"

    recordings = [("raw", collapsed)]
    loads: list[dict[str, Any]] = []
    if args.svg:
        recordings.append(("flamegraph", RESULTS / f"{base}.svg"))
    for fmt, out in recordings:
        load_seconds = args.duration + 3
        before = rls.metrics()
        load = subprocess.Popen(
            [h2load_binary(), "-c", str(args.clients), "-m", str(args.streams),
             "-D", str(load_seconds), "-d", str(body), "-H", "content-type: application/grpc",
             "-H", "te: trailers", f"http://127.0.0.1:{rls.grpc_port}{METHOD}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(1.0)  # let the load settle
        cmd = [py_spy(), "record", "--pid", str(rls.pid), "--duration", str(args.duration),
               "--rate", str(args.rate), "--format", fmt, "-o", str(out)]
        if args.native:
            cmd.append("--native")
        spy = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration + 60)
        try:
            stdout, _ = load.communicate(timeout=load_seconds + 30)
        except subprocess.TimeoutExpired:
            load.kill()
            stdout, _ = load.communicate()
        if spy.returncode != 0:
            raise SystemExit(f"py-spy failed ({spy.returncode}): {spy.stderr}{spy.stdout}")
        m = re.search(r"finished in .*?([\d.]+) req/s", stdout)
        fm = failure_mode_answers(before, rls.metrics())
        loads.append({"recording": fmt, "rps": float(m.group(1)) if m else None, **fm.json()})
        print(f"py-spy {fmt}: {out.relative_to(ROOT)}; h2load during the recording: "
              f"{m.group(1) if m else '?'} req/s, failure-mode answers {fm.count} "
              f"(valid: {validity(fm)}){' ' + str(fm.breakdown) if fm.count else ''}",
              flush=True)

    text, samples, top_own, top_total = summarise(collapsed.read_text(), args.top)
    fm_note = ", ".join(f"{x['recording']}: {x['rps']} req/s, failure-mode answers "
                        f"{x['failure_mode_answers']} (valid: {'yes' if x['valid'] else 'INVALID'})"
                        for x in loads)
    header = (f"rls {args.backend} backend under h2load -c {args.clients} -m {args.streams} "
              f"(3-descriptor request), py-spy record --rate {args.rate} --duration "
              f"{args.duration}{' --native' if args.native else ''}, pid {rls.pid}, "
              f"{os.cpu_count()} CPUs, loadavg {os.getloadavg()[0]:.1f}\n"
              f"load during the recording(s): {fm_note}\n\n")
    summary = RESULTS / f"{base}-top.txt"
    summary.write_text(header + text + "\n")
    print(header + text)
    print(f"\nsummary: {summary.relative_to(ROOT)}")
    write_results(base.removesuffix("-quick").replace("-", "_"), {
        "params": vars(args), "samples": samples, "load": loads,
        "failure_mode_answers": sum(x["failure_mode_answers"] for x in loads),
        "valid": all(x["valid"] for x in loads),
        "top_own": [{"function": f, "samples": n, "pct": round(n / samples * 100, 2)}
                    for f, n in top_own],
        "top_total": [{"function": f, "samples": n, "pct": round(n / samples * 100, 2)}
                      for f, n in top_total],
    }, args.quick)
    rls.stop()


if __name__ == "__main__":
    main()
