"""Figures for docs/reliability.md: what a heavy or hostile RLQS client costs everyone else.

Usage: python tests/quota/quota_load.py [turns|stall|rss|all]
Not a test (no wall-clock assertions in tests).
- turns: in this process, the longest turn of the event loop while a stream is handed a report
  of 20,000 new buckets and then the same again, in CPU time of the loop's thread (wall time
  on a shared machine also counts the time the OS ran something else), with rls's GC tuning.
Then starts one rls (memory store) and measures:
- stall: the longest ShouldRateLimit call (one every 2 ms from another thread) while a stream
  reports 20,000 new buckets (~330 KB) and then the same 20,000 again (a periodic report), and
  the rls CPU per one-bucket report on that stream against a stream holding one bucket;
- rss: rls's RSS while a client sends 2.4 MB reports and never reads the answers.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.rate_limit_quota.v3 import rlqs_pb2
from envoy.service.ratelimit.v3 import rls_pb2

ROOT = Path(__file__).resolve().parents[2]
QUOTA = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"
SHOULD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
CONFIG = """
domain: q
descriptors:
  - key: client
    rate_limit: {unit: hour, requests_per_unit: 1000}
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


HTTP = {"port": 0}


def gc_pauses() -> str:
    """rls's garbage-collector pauses so far, from /metrics: count per generation and the
    bucket bound of the longest."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{HTTP['port']}/metrics").read().decode()
    worst: dict[str, str] = {}
    last: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("rls_gc_pause_seconds_bucket"):
            gen = line.split('generation="')[1].split('"')[0]
            le = line.split('le="')[1].split('"')[0]
            count = float(line.rsplit(" ", 1)[1])
            if count > last.get(gen, 0):
                worst[gen] = le
            last[gen] = count
    return ", ".join(f"gen {g}: {int(last[g])} (longest <= {worst.get(g, '?')} s)"
                     for g in sorted(last))


def start_rls(folder: Path) -> tuple[subprocess.Popen[bytes], int]:
    (folder / "q.yaml").write_text(CONFIG)
    port, http = free_port(), free_port()
    HTTP["port"] = http
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLS_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rls", "serve", "--config", str(folder / "q.yaml"),
         "--grpc-addr", f"127.0.0.1:{port}", "--http-addr", f"127.0.0.1:{http}",
         "--shutdown-delay-ms", "0"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    grpc.channel_ready_future(channel).result(timeout=30)
    channel.close()
    time.sleep(1)
    return proc, port


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def report(names: list[str], value_pad: str = "") -> bytes:
    message = rlqs_pb2.RateLimitQuotaUsageReports(domain="q")
    for name in names:
        usage = message.bucket_quota_usages.add()
        usage.bucket_id.bucket["client"] = name + value_pad
        usage.num_requests_allowed = 1
    return message.SerializeToString()


class Ticker(threading.Thread):
    """ShouldRateLimit every 2 ms; the longest call seen since the last `take`."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.call = self.channel.unary_unary(SHOULD)
        self.worst = 0.0
        self.stop = False

    def run(self) -> None:
        request = rls_pb2.RateLimitRequest(domain="q", descriptors=[
            ratelimit_pb2.RateLimitDescriptor(entries=[
                ratelimit_pb2.RateLimitDescriptor.Entry(key="client", value="ticker")])
        ]).SerializeToString()
        while not self.stop:
            start = time.perf_counter()
            self.call(request, timeout=30)
            self.worst = max(self.worst, time.perf_counter() - start)
            time.sleep(0.002)

    def take(self) -> float:
        worst, self.worst = self.worst, 0.0
        return worst * 1000


class Stream:
    """One RLQS stream fed from a queue; answers counted by bucket action."""

    def __init__(self, port: int) -> None:
        self.channel = grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", 64 << 20)])
        self.inbox: queue.Queue[bytes | None] = queue.Queue()
        self.actions = 0
        self.lock = threading.Condition()
        self.answers = self.channel.stream_stream(QUOTA)(self._requests())
        threading.Thread(target=self._read, daemon=True).start()

    def _requests(self) -> Iterator[bytes]:
        while (item := self.inbox.get()) is not None:
            yield item

    def _read(self) -> None:
        for data in self.answers:
            n = len(rlqs_pb2.RateLimitQuotaResponse.FromString(data).bucket_action)
            with self.lock:
                self.actions += n
                self.lock.notify_all()

    def ask(self, data: bytes, actions: int) -> None:
        with self.lock:
            want = self.actions + actions
        self.inbox.put(data)
        with self.lock:
            self.lock.wait_for(lambda: self.actions >= want, timeout=120)


def stall(port: int, pid: int) -> None:
    ticker = Ticker(port)
    ticker.start()
    time.sleep(1)
    print(f"idle: longest ShouldRateLimit {ticker.take():.1f} ms")
    big = Stream(port)
    names = [f"client-{i:05}" for i in range(20_000)]
    data = report(names)
    start = time.perf_counter()
    big.ask(data, 2 * 20_000)
    print(f"20,000 new buckets ({len(data) / 1000:.0f} KB): answered in "
          f"{time.perf_counter() - start:.2f} s, longest ShouldRateLimit {ticker.take():.1f} ms")
    start = time.perf_counter()
    big.ask(data, 2 * 20_000)
    print(f"the same 20,000 again (periodic report): answered in "
          f"{time.perf_counter() - start:.2f} s, longest ShouldRateLimit {ticker.take():.1f} ms")
    small = Stream(port)
    for label, stream, name in (("20,000", big, names[0]), ("1", small, "solo")):
        one = report([name])
        stream.ask(one, 2)
        cpu = cpu_s(pid)
        for _ in range(200):
            stream.ask(one, 2)
        print(f"one-bucket report on a stream of {label} bucket(s): "
              f"{(cpu_s(pid) - cpu) / 200 * 1000:.2f} ms rls CPU each")
    ticker.stop = True
    print(f"rls GC pauses: {gc_pauses()}")


def rss(port: int, pid: int) -> None:
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    pad = "x" * 100
    sent = 0
    before = rss_mb(pid)

    def requests() -> Iterator[bytes]:
        nonlocal sent
        for i in range(120):
            yield report([f"r{i}-{j:05}" for j in range(20_000)], pad)
            sent += 1

    answers = channel.stream_stream(QUOTA)(requests())  # never read
    peak = before
    for _ in range(40):
        time.sleep(0.5)
        peak = max(peak, rss_mb(pid))
    print(f"non-reading client, 2.4 MB reports: {sent} of 120 sent in 20 s; rls RSS "
          f"{before:.0f} -> peak {peak:.0f} MB")
    answers.cancel()


def turns() -> None:
    import asyncio

    from prometheus_client import CollectorRegistry

    from rls.config.loader import load_files
    from rls.process.gc_tuning import freeze_startup_objects, tune_thresholds
    from rls.services.quota import QuotaService, QuotaStream
    from rls.settings import Settings
    from rls.stores.memory import MemoryBackend

    tune_thresholds()
    message = rlqs_pb2.RateLimitQuotaUsageReports.FromString(
        report([f"client-{i:05}" for i in range(20_000)]))
    config = load_files([("q.yaml", CONFIG)])

    async def run() -> None:
        svc = QuotaService(lambda: config, MemoryBackend(sweep_interval=0), Settings(),
                           CollectorRegistry())
        stream = QuotaStream(svc.context)
        freeze_startup_objects()
        worst = [0.0, 0.0]
        done = False

        async def tick() -> None:
            while not done:
                cpu, wall = time.thread_time(), time.perf_counter()
                await asyncio.sleep(0)
                worst[0] = max(worst[0], time.thread_time() - cpu)
                worst[1] = max(worst[1], time.perf_counter() - wall)

        task = asyncio.get_running_loop().create_task(tick())
        for label in ("20,000 new buckets", "the same 20,000 again"):
            worst[:] = [0.0, 0.0]
            start = time.perf_counter()
            await stream.handle(message)
            stream._out.drop()
            print(f"{label}: handled in {time.perf_counter() - start:.2f} s; longest loop turn "
                  f"{worst[0] * 1000:.1f} ms CPU ({worst[1] * 1000:.1f} ms wall)")
        done = True
        await task

    asyncio.run(run())


def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    if what in ("turns", "all"):
        turns()
    if what == "turns":
        return
    with tempfile.TemporaryDirectory() as folder:
        proc, port = start_rls(Path(folder))
        try:
            if what in ("stall", "all"):
                stall(port, proc.pid)
            if what in ("rss", "all"):
                rss(port, proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
