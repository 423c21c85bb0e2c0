"""Shared plumbing for the benchmark scripts: processes on free loopback ports, h2load, tables.

Nothing here touches a service the scripts did not start: every redis-server, rls and floor
server runs on a free 127.0.0.1 port picked by the kernel and is stopped at exit. Every load
run is bounded in time (h2load -D / -n plus a subprocess timeout).
"""

from __future__ import annotations

import atexit
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
PYTHON = sys.executable

SERVICE = "envoy.service.ratelimit.v3.RateLimitService"
METHOD = f"/{SERVICE}/ShouldRateLimit"

# The request Envoy sends for `GET /items?page=1` by alice through envoy/gateway.yaml
# (shared/reference/envoy.md §3): user+path, api+user, remote_address.
DESCRIPTORS: tuple[tuple[tuple[str, str], ...], ...] = (
    (("user", "alice"), ("path", "/items?page=1")),
    (("api", "items"), ("user", "alice")),
    (("remote_address", "127.0.0.1"),),
)

HIGH = 1_000_000_000  # a limit no benchmark reaches

# Descriptor config for the benchmarks. `bench`: the three descriptors above with limits never
# reached. `bench_over`: the same tree, but remote_address allows 1 per hour, so after the first
# call every request is OVER_LIMIT (the other two descriptors pass and are not charged).
BENCH_CONFIG = f"""\
domain: bench
descriptors:
  - key: user
    descriptors:
      - key: path
        rate_limit: {{unit: minute, requests_per_unit: {HIGH}}}
  - key: api
    value: items
    descriptors:
      - key: user
        rate_limit: {{name: items_per_user, unit: minute, requests_per_unit: {HIGH}}}
  - key: remote_address
    rate_limit: {{unit: minute, requests_per_unit: {HIGH}}}
"""

OVER_CONFIG = f"""\
domain: bench_over
descriptors:
  - key: user
    descriptors:
      - key: path
        rate_limit: {{unit: minute, requests_per_unit: {HIGH}}}
  - key: api
    value: items
    descriptors:
      - key: user
        rate_limit: {{name: items_per_user, unit: minute, requests_per_unit: {HIGH}}}
  - key: remote_address
    rate_limit: {{unit: hour, requests_per_unit: 1}}
"""

_cleanups: list[Callable[[], None]] = []


def _run_cleanups() -> None:
    while _cleanups:
        fn = _cleanups.pop()
        try:
            fn()
        except Exception:
            pass


atexit.register(_run_cleanups)


def _on_term(signum: int, frame: Any) -> None:
    _run_cleanups()
    raise SystemExit(128 + signum)


signal.signal(signal.SIGTERM, _on_term)


# --------------------------------------------------------------------------- processes


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) a process has used so far (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(
    predicate: Callable[[], bool],
    timeout: float,
    what: str,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            text = log.read_text(errors="replace")[-4000:] if log else ""
            raise RuntimeError(f"process exited ({proc.returncode}) waiting for {what}:\n{text}")
        try:
            if predicate():
                return
        except Exception:
            pass
        if time.monotonic() > deadline:
            text = log.read_text(errors="replace")[-4000:] if log else ""
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}:\n{text}")
        time.sleep(0.02)


def workdir(prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=f"rls-bench-{prefix}-"))
    _cleanups.append(lambda: shutil.rmtree(path, ignore_errors=True))
    return path


@dataclass
class Proc:
    proc: subprocess.Popen[bytes]
    log_path: Path
    name: str

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def spawn(cmd: Sequence[str], name: str, log_dir: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> Proc:
    """Start a process logging to log_dir. The working directory defaults to log_dir, not the
    repository, so `python -m rls` imports the installed rls (or the one on PYTHONPATH)."""
    log_path = log_dir / f"{name}.log"
    cwd = cwd or log_dir
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RLS_")}
    full_env.update(env or {})
    with open(log_path, "wb") as log:
        p = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=full_env,
                             cwd=str(cwd))
    proc = Proc(p, log_path, name)
    _cleanups.append(proc.stop)
    return proc


def installed(command: str, package: str) -> str:
    """The path of `command`; installed with apt-get (as root) when missing, as CI does."""
    found = shutil.which(command)
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "update", "-qq"], check=False, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", package], check=True,
                       capture_output=True)
        found = shutil.which(command)
        if found:
            return found
    raise SystemExit(f"{command} is not installed (apt-get install {package})")


def redis_server_binary() -> str:
    return installed("redis-server", "redis-server")


@dataclass
class RedisProc(Proc):
    port: int = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> Any:
        import redis

        return redis.Redis(port=self.port)


def start_redis(log_dir: Path | None = None, *extra: str) -> RedisProc:
    """A private redis-server on a free port (never the machine's own 6379)."""
    log_dir = log_dir or workdir("redis")
    port = free_port()
    data = log_dir / f"redis-{port}"
    data.mkdir()
    cmd = [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
           "--appendonly", "no", "--dir", str(data), *extra]
    base = spawn(cmd, f"redis-{port}", log_dir)
    server = RedisProc(base.proc, base.log_path, base.name, port)
    wait_until(lambda: server.client().ping(), 10, f"redis-server on {port}", base.proc,
               base.log_path)
    return server


@dataclass
class RlsProc(Proc):
    grpc_port: int = 0
    http_port: int = 0

    @property
    def grpc_addr(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return scrape(self.http_url + "/metrics")

    def metric(self, name: str, **labels: str) -> float:
        return metric_sum(self.metrics(), name, **labels)

    def metrics_after(self, name: str, at_least: float, timeout: float = 5.0, **labels: str
                      ) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Scrape until `name` reaches `at_least` (workers flush their metrics once a second)."""
        deadline = time.monotonic() + timeout
        while True:
            samples = self.metrics()
            if metric_sum(samples, name, **labels) >= at_least or time.monotonic() > deadline:
                return samples
            time.sleep(0.1)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

# rls_request_errors_total reasons whose calls rls already counts in
# rls_failure_mode_answers_total (a call over --max-inflight or --overload-cap-ms increments
# both): left out of the sum so that no call is counted twice.
COUNTED_AS_FAILURE_ANSWER = frozenset({"overloaded"})


@dataclass
class FailureModeAnswers:
    """Calls of a measured run that the store did not decide: answered by the failure mode
    (allow / deny / fallback), refused by rls (UNAVAILABLE / RESOURCE_EXHAUSTED) or failed
    with a gRPC error. A throughput or latency figure with any of them is invalid: it counts
    answers that are not decisions."""

    count: int
    breakdown: dict[str, int] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return self.count == 0

    def json(self) -> dict[str, Any]:
        return {"failure_mode_answers": self.count, "failure_mode_breakdown": self.breakdown,
                "valid": self.valid}

    def __add__(self, other: FailureModeAnswers) -> FailureModeAnswers:
        merged = dict(self.breakdown)
        for k, v in other.breakdown.items():
            merged[k] = merged.get(k, 0) + v
        return FailureModeAnswers(self.count + other.count, merged)


NO_FAILURE_ANSWERS = FailureModeAnswers(0)


def failure_mode_answers(before: Samples, after: Samples,
                         ignore_reasons: Iterable[str] = ()) -> FailureModeAnswers:
    """Calls answered by the failure mode between two /metrics scrapes of one rls.

    = the growth of rls_failure_mode_answers_total (every reason: store_down, store_error,
    store_slow, overloaded; every answer: allow, deny, fallback, unavailable,
    resource_exhausted) + the growth of rls_request_errors_total (gRPC errors), except the
    reasons already counted in the first (`overloaded`) and `ignore_reasons` (soak.py sends
    invalid requests on purpose: `invalid_argument` is its expected outcome there).
    The breakdown is keyed `<reason>/<answer>` and `request_error/<reason>`.
    """
    skip = COUNTED_AS_FAILURE_ANSWER | set(ignore_reasons)
    breakdown: dict[str, int] = {}

    def grow(name: str, key: Callable[[dict[str, str]], str | None]) -> None:
        keys = {lab for (n, lab) in (*before, *after) if n == name}
        for lab in keys:
            k = key(dict(lab))
            if k is None:
                continue
            n = after.get((name, lab), 0.0) - before.get((name, lab), 0.0)
            if n:
                breakdown[k] = breakdown.get(k, 0) + round(n)

    grow("rls_failure_mode_answers_total",
         lambda lab: f"{lab.get('reason', '?')}/{lab.get('answer', '?')}")
    grow("rls_request_errors_total",
         lambda lab: None if lab.get("reason") in skip else f"request_error/{lab.get('reason')}")
    return FailureModeAnswers(sum(breakdown.values()), breakdown)


def validity(fm: FailureModeAnswers | None) -> str:
    """The `valid` column: INVALID when any call of the figure's run was not decided."""
    return "yes" if fm is None or fm.valid else "INVALID"


def fm_cell(fm: FailureModeAnswers | None) -> Any:
    """The `failure-mode answers` column ('-' where no rls ran: floor, Envoy alone)."""
    return "-" if fm is None else fm.count


def verify_rls_run(rls: RlsProc, before: Samples, total: int, slack: int, label: str,
                   **labels: str) -> tuple[Samples, FailureModeAnswers]:
    """Check rls counted a load run's calls; return (metrics after, failure-mode answers).

    `rls_requests_total{labels}` must grow by `total` (h2load's or wrk's count) plus at most
    `slack` (calls in flight at the load tool's deadline are answered but not counted by it),
    else this raises — unless calls were answered by the failure mode: a deny answer has
    another code and a refused call (UNAVAILABLE) none, so the count cannot match; the run is
    then returned as it is and its figure is marked invalid by the caller.
    """
    start = metric_sum(before, "rls_requests_total", **labels)
    after = rls.metrics_after("rls_requests_total", start + total, **labels)
    fm = failure_mode_answers(before, after)
    done = metric_sum(after, "rls_requests_total", **labels) - start
    if not total <= done <= total + slack:
        if fm.valid:
            raise RuntimeError(f"{label}: rls counted {done:.0f} calls {labels} for {total} sent")
        print(f"{label}: rls counted {done:.0f} calls {labels} for {total} sent; "
              f"{fm.count} failure-mode answers {fm.breakdown}", flush=True)
    return after, fm


def target_result(what: str, measured: float | None, passed: bool,
                  fm: FailureModeAnswers | None = None, note: str = "") -> dict[str, Any]:
    """One performance goal: PASS only when met by a valid figure (0 failure-mode answers)."""
    why = note
    if fm is not None and not fm.valid:
        passed = False
        why = f"invalid: {fm.count} failure-mode answers" + (f"; {note}" if note else "")
    return {"target": what, "measured": measured, "result": "PASS" if passed else "FAIL",
            "failure_mode_answers": None if fm is None else fm.count, "why": why}


def print_targets(targets: Sequence[dict[str, Any]],
                  title: str = "performance targets (PASS needs 0 failure-mode answers)") -> str:
    print()
    return table(["target", "measured", "result", "why"],
                 [[t["target"], t["measured"], t["result"], t["why"] or "-"] for t in targets],
                 title)


def write_config(directory: Path, *texts: str) -> Path:
    """Descriptor files into `directory` (one file per text); returns the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(texts or (BENCH_CONFIG, OVER_CONFIG)):
        (directory / f"bench{i}.yaml").write_text(text)
    return directory


def rls_command(config: Path, grpc_port: int, http_port: int, redis_url: str | None = None,
                extra: Sequence[str] = ()) -> list[str]:
    cmd = [PYTHON, "-m", "rls", "serve", "--config", str(config),
           "--grpc-addr", f"127.0.0.1:{grpc_port}", "--http-addr", f"127.0.0.1:{http_port}",
           "--log-level", "warning"]
    if redis_url:
        cmd += ["--redis-url", redis_url]
    return cmd + list(extra)


def start_rls(config: Path, log_dir: Path, redis_url: str | None = None,
              extra: Sequence[str] = (), name: str = "rls", timeout: float = 20.0) -> RlsProc:
    """`python -m rls serve` on free ports; waits for /healthcheck 200."""
    grpc_port, http_port = free_port(), free_port()
    base = spawn(rls_command(config, grpc_port, http_port, redis_url, extra),
                 f"{name}-{grpc_port}", log_dir)
    rls = RlsProc(base.proc, base.log_path, base.name, grpc_port, http_port)
    wait_until(lambda: http_get(rls.http_url + "/healthcheck")[0] == 200, timeout,
               f"{name} /healthcheck", base.proc, base.log_path)
    wait_until(lambda: grpc_call(rls.grpc_addr, request_bytes("bench"))[0] == 0, timeout,
               f"{name} gRPC", base.proc, base.log_path)
    return rls


def revision_tree(rev: str, base: Path) -> tuple[str, Path]:
    """A detached worktree of `rev` (read-only use); removed at exit by the caller."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True,
                         capture_output=True, text=True).stdout.strip()
    path = base / f"rev-{sha}"
    if not path.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), sha],
                       check=True, capture_output=True)
    return sha, path


def start_rls_at(config: Path, log_dir: Path, name: str, code: Path | None,
                 redis_url: str | None, extra: list[str],
                 env: dict[str, str] | None = None) -> RlsProc:
    """`python -m rls serve` from `code` (a worktree) or the installed rls (None)."""
    grpc_port, http_port = free_port(), free_port()
    cmd = rls_command(config, grpc_port, http_port, redis_url, extra)
    base = spawn(cmd, f"{name.replace(' ', '-')}-{grpc_port}", log_dir, env=env, cwd=code)
    rls = RlsProc(base.proc, base.log_path, base.name, grpc_port, http_port)
    wait_until(lambda: http_get(rls.http_url + "/healthcheck")[0] == 200, 30,
               f"{name} /healthcheck", base.proc, base.log_path)
    return rls


@dataclass
class FloorProc(Proc):
    grpc_port: int = 0

    @property
    def grpc_addr(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


def start_floor(log_dir: Path, loop: str = "auto") -> FloorProc:
    """benchmarks/floor_server.py: an empty grpc.aio ShouldRateLimit handler, on the event loop
    rls runs on (`loop`: auto, uvloop, asyncio; auto is rls's default too)."""
    port = free_port()
    base = spawn([PYTHON, str(BENCH / "floor_server.py"), "--port", str(port), "--loop", loop],
                 f"floor-{loop}-{port}", log_dir)
    floor = FloorProc(base.proc, base.log_path, base.name, port)
    wait_until(lambda: grpc_call(floor.grpc_addr, request_bytes("bench"))[0] == 0, 20,
               "floor server gRPC", base.proc, base.log_path)
    return floor


# --------------------------------------------------------------------------- requests


def request_bytes(domain: str = "bench",
                  descriptors: Iterable[Iterable[tuple[str, str]]] = DESCRIPTORS,
                  hits_addend: int = 0) -> bytes:
    from envoy.service.ratelimit.v3 import rls_pb2

    req = rls_pb2.RateLimitRequest(domain=domain, hits_addend=hits_addend)
    for entries in descriptors:
        d = req.descriptors.add()
        for k, v in entries:
            d.entries.add(key=k, value=v)
    return req.SerializeToString()


def grpc_frame(message: bytes) -> bytes:
    """A gRPC length-prefixed message: flag 0, 4-byte big-endian length, protobuf bytes."""
    return b"\x00" + struct.pack(">I", len(message)) + message


def write_frame(path: Path, message: bytes) -> Path:
    path.write_bytes(grpc_frame(message))
    return path


def grpc_call(addr: str, body: bytes, timeout: float = 2.0) -> tuple[int, Any]:
    """One real gRPC call (python grpcio): (status code value, RateLimitResponse or details)."""
    import grpc
    from envoy.service.ratelimit.v3 import rls_pb2

    with grpc.insecure_channel(addr) as channel:
        call = channel.unary_unary(METHOD)  # raw bytes in and out
        try:
            data = call(body, timeout=timeout)
        except grpc.RpcError as exc:
            return exc.code().value[0], exc.details()
    return 0, rls_pb2.RateLimitResponse.FromString(data)


def check_grpc_ok(addr: str, body: bytes, expect_code: int | None = None) -> Any:
    """A python gRPC call that must return grpc-status 0 (and the expected overall_code)."""
    status, resp = grpc_call(addr, body)
    if status != 0:
        raise RuntimeError(f"gRPC call to {addr} failed: status {status}: {resp}")
    if expect_code is not None and resp.overall_code != expect_code:
        raise RuntimeError(f"{addr}: overall_code {resp.overall_code}, expected {expect_code}")
    return resp


# --------------------------------------------------------------------------- HTTP / metrics


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    status, body = http_get(url, timeout=5)
    if status != 200:
        raise RuntimeError(f"{url}: HTTP {status}")
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metric_sum(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
               **labels: str) -> float:
    return sum(v for (n, lab), v in samples.items()
               if n == name and labels.items() <= dict(lab).items())


# --------------------------------------------------------------------------- h2load


def h2load_binary() -> str:
    return installed("h2load", "nghttp2-client")


@dataclass
class H2Result:
    label: str
    total: int
    succeeded: int
    failed: int
    errored: int
    timeout: int
    status_2xx: int
    elapsed_s: float
    rps: float
    latencies_us: list[int] = field(repr=False, default_factory=list)
    command: list[str] = field(default_factory=list)

    def check(self) -> None:
        """Every request completed with HTTP 200 (grpc-status is checked server side)."""
        bad = self.total - self.succeeded
        if self.total == 0 or bad or self.failed or self.errored or self.timeout \
                or self.status_2xx != self.succeeded:
            raise RuntimeError(
                f"h2load {self.label}: {self.total} total, {self.succeeded} succeeded, "
                f"{self.failed} failed, {self.errored} errored, {self.timeout} timeout, "
                f"{self.status_2xx} 2xx"
            )

    def summary(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("label", "total", "succeeded", "failed",
                                             "errored", "timeout", "status_2xx", "elapsed_s")}
        out["rps"] = round(self.rps, 1)
        out.update(latency_stats(self.latencies_us))
        return out


def h2load(url: str, body_file: Path, *, clients: int, streams: int,
           duration: float | None = None, requests: int | None = None,
           warmup: float | None = None, rps_per_client: float | None = None,
           label: str = "", log_dir: Path | None = None, threads: int = 1,
           extra_headers: Sequence[str] = ()) -> H2Result:
    """Run h2load (gRPC unary POSTs of `body_file`) and parse counts, req/s and latencies."""
    log_dir = log_dir or workdir("h2load")
    log_file = log_dir / f"h2load-{time.monotonic_ns()}.log"
    cmd = [h2load_binary(), "-t", str(threads), "-c", str(clients), "-m", str(streams),
           "-d", str(body_file), "-H", "content-type: application/grpc", "-H", "te: trailers",
           "--log-file", str(log_file)]
    for h in extra_headers:
        cmd += ["-H", h]
    if duration is not None:
        cmd += ["-D", f"{round(duration * 1000)}ms"]  # h2load takes integer units
        if warmup:
            cmd += ["--warm-up-time", f"{round(warmup * 1000)}ms"]
        limit = duration + (warmup or 0) + 30
    else:
        assert requests is not None
        cmd += ["-n", str(requests)]
        limit = 300
    if rps_per_client is not None:
        cmd += [f"--rps={rps_per_client:g}"]
    cmd.append(url)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    out = proc.stdout
    if proc.returncode != 0 and "requests:" not in out:
        raise RuntimeError(f"h2load failed ({proc.returncode}): {proc.stderr}\n{out}")
    res = parse_h2load(out, label)
    res.command = cmd
    res.latencies_us = read_h2load_log(log_file)
    log_file.unlink(missing_ok=True)
    return res


@dataclass
class PacedResult:
    label: str
    offered_rps: float
    achieved_rps: float
    errors: int
    latencies_us: list[float] = field(repr=False, default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"label": self.label, "offered_rps": round(self.offered_rps, 1),
                "achieved_rps": round(self.achieved_rps, 1), "errors": self.errors,
                **latency_stats(self.latencies_us)}


PACED_PER_PROCESS = 1500  # calls/s one paced client process sends on time (measured here)


def _paced_worker(addr: str, method: str, bodies: Sequence[bytes], rate: float, n: int,
                  start_at: float) -> tuple[list[float], int]:
    """One client process: call i starts at start_at + i / rate (time.time clock, shared by
    the processes); latencies in µs from each scheduled start."""
    import asyncio

    import grpc

    async def run() -> tuple[list[float], int]:
        lat: list[float] = []
        errors = 0
        async with grpc.aio.insecure_channel(addr) as channel:
            call = channel.unary_unary(method)
            await call(bodies[0], timeout=5)  # connected before the clock starts
            tasks = []

            async def one(at: float, body: bytes) -> None:
                nonlocal errors
                try:
                    await call(body, timeout=5)
                except grpc.RpcError:
                    errors += 1
                    return
                lat.append((time.time() - at) * 1e6)

            for i in range(n):
                at = start_at + i / rate
                delay = at - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.ensure_future(one(at, bodies[i % len(bodies)])))
            await asyncio.gather(*tasks)
        return lat, errors

    return asyncio.run(run())


def paced(addr: str, method: str, bodies: Sequence[bytes], rate: float, seconds: float,
          label: str = "") -> PacedResult:
    """Open loop at a steady `rate` calls/s: calls start evenly spaced, and each latency counts
    from the call's scheduled start, so a server (or client) that falls behind shows as latency
    instead of a slower send rate. One client process per PACED_PER_PROCESS calls/s (grpc.aio
    in one process cannot send more on time), their schedules interleaved.

    Why not `h2load --rps`: h2load paces with a coarse timer and sends each tick's share at
    once, measured here at ~20 requests in the same millisecond every 10 ms for 2,000/s over 4
    connections (and every client's tick aligned with more connections), so its latencies
    measure those bursts queueing, not a steady load. These clients cost CPU on the same cores;
    they do so equally for every server measured."""
    from concurrent.futures import ProcessPoolExecutor

    procs = max(1, -(-int(rate) // PACED_PER_PROCESS))
    each = rate / procs
    n = max(1, int(each * seconds))
    start_at = time.time() + 1.0 + 0.2 * procs  # every process started and connected
    with ProcessPoolExecutor(procs) as pool:
        futures = [pool.submit(_paced_worker, addr, method, list(bodies), each, n,
                               start_at + k / rate) for k in range(procs)]
        parts = [f.result() for f in futures]
    elapsed = time.time() - start_at
    lat = [x for part, _ in parts for x in part]
    errors = sum(e for _, e in parts)
    return PacedResult(label, rate, n * procs / max(elapsed, 1e-9), errors, lat)


def parse_h2load(out: str, label: str) -> H2Result:
    import re

    fin = re.search(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s", out)
    req = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                    r"(\d+) failed, (\d+) errored, (\d+) timeout", out)
    codes = re.search(r"status codes: (\d+) 2xx", out)
    if not (fin and req and codes):
        raise RuntimeError(f"cannot parse h2load output:\n{out}")
    elapsed = float(fin.group(1)) / (1000 if fin.group(2) == "ms" else 1)
    return H2Result(label, int(req.group(1)), int(req.group(4)), int(req.group(5)),
                    int(req.group(6)), int(req.group(7)), int(codes.group(1)), elapsed,
                    float(fin.group(3)))


def read_h2load_log(path: Path) -> list[int]:
    """Per-request latencies (µs) from h2load --log-file (start µs, status, elapsed µs)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[1] == "200":
            out.append(int(parts[2]))
    return out


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * len(sorted_values) + 0.5) - 1))
    return float(sorted_values[k])


def latency_stats(values_us: Sequence[float]) -> dict[str, float]:
    """mean / p50 / p90 / p99 / p99.9 / max in milliseconds."""
    if not values_us:
        return {}
    s = sorted(values_us)
    return {
        "n": len(s),
        "mean_ms": round(statistics.fmean(s) / 1000, 3),
        "p50_ms": round(percentile(s, 50) / 1000, 3),
        "p90_ms": round(percentile(s, 90) / 1000, 3),
        "p99_ms": round(percentile(s, 99) / 1000, 3),
        "p999_ms": round(percentile(s, 99.9) / 1000, 3),
        "max_ms": round(s[-1] / 1000, 3),
    }


# --------------------------------------------------------------------------- output


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "") -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            if v != v:
                return "-"
            if v.is_integer() and abs(v) < 1e15:
                return f"{int(v):,}"
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
        if isinstance(v, int) and not isinstance(v, bool):
            return f"{v:,}"
        return "-" if v is None else str(v)

    cells = [[fmt(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    lines = []
    if title:
        lines.append(title)
    lines.append("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    def numeric(text: str) -> bool:
        try:
            float(text.replace(",", "").rstrip("x%"))
            return True
        except ValueError:
            return text == "-"

    for r in cells:
        padded = [c.rjust(w) if i and numeric(c) else c.ljust(w)
                  for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append("| " + " | ".join(padded) + " |")
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def environment() -> dict[str, Any]:
    def version(pkg: str) -> str | None:
        try:
            from importlib.metadata import version as v

            return v(pkg)
        except Exception:
            return None

    def tool(cmd: list[str]) -> str | None:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            return (out.stdout or out.stderr).strip().splitlines()[0]
        except Exception:
            return None

    return {
        "time": _START["time"],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_start": _START["loadavg"],
        "cpu_pressure_start": _START["cpu_pressure"],
        "packages": {p: version(p) for p in ("rls", "grpcio", "protobuf", "redis", "hiredis",
                                             "limits", "throttled-py", "coredis")},
        "rls_source": rls_source(),
        "h2load": tool(["h2load", "--version"]),
        "redis_server": tool(["redis-server", "--version"]),
    }


def rls_source() -> dict[str, Any]:
    """Which rls was measured: the imported package's path, and the repository's commit and
    local changes when it is this checkout (read-only git commands)."""
    try:
        import rls

        path = Path(rls.__file__).resolve().parent
    except Exception as exc:
        return {"error": str(exc)}
    out: dict[str, Any] = {"path": str(path)}
    marker = path.parent / "COMMIT"  # written next to a snapshot (see README)
    if marker.is_file():
        out["commit"] = marker.read_text().strip()
    if path.parent == ROOT:
        def git(*args: str) -> str:
            res = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                                 text=True, timeout=10)
            return res.stdout.strip()

        out["commit"] = git("rev-parse", "HEAD")
        out["changed_files"] = git("status", "--porcelain", "--", "rls", "lua").splitlines()
    return out


def cpu_pressure() -> str | None:
    """/proc/pressure/cpu "some" line: how much runnable work waited for a CPU (noise gauge)."""
    try:
        return Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except OSError:
        return None


_START = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "loadavg": os.getloadavg(),
          "cpu_pressure": cpu_pressure()}  # when the script started


def write_results(name: str, data: dict[str, Any], quick: bool, tables: Sequence[str] = ()) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    env = data.setdefault("environment", environment())
    env["loadavg_end"] = os.getloadavg()
    env["cpu_pressure_end"] = cpu_pressure()
    data["quick"] = quick
    if tables:
        data["tables"] = list(tables)
    path = RESULTS / f"{name}{'-quick' if quick else ''}.json"
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(f"\nresults: {path.relative_to(ROOT)}", flush=True)
    return path


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")
