"""Plumbing of the gRPC-surface hostile suites (test_grpc_surface_hostile.py,
test_extproc_hostile.py, test_counters_grpc_hostile.py): a real `rls serve` with the response
cache on (memory store), raw-bytes calls, RSS and "no traceback" checks."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import grpc
from conftest import ROOT, RlsProcess, free_port, http_get, wait_until
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from .metrics import metric

PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
EXAMPLE = ROOT / "config" / "example.yaml"
CACHE_RULES = """
store: memory://
key_prefix: "h:"
rules:
- api: items
  methods: [GET]
  key: {query: true}
  max_entry_bytes: 64KiB
"""
# A process that grew past this while under attack is holding what it was sent.
RSS_GROWTH_LIMIT = 150 << 20


def cache_rules(tmp_path: Path) -> Path:
    path = tmp_path / "cache.yaml"
    path.write_text(CACHE_RULES)
    return path


def start_rls(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
              extproc_on_grpc_port: bool = False) -> RlsProcess:
    """`rls serve` on free ports with the response cache on (a memory store); unlike the
    rls_factory fixture it can put ext_proc on the main gRPC port. The caller stops it."""
    grpc_port, http_port = free_port(), free_port()
    extproc_port = grpc_port if extproc_on_grpc_port else free_port()
    cmd = [sys.executable, "-m", "rls", "serve", "--config", str(EXAMPLE),
           "--grpc-addr", f"127.0.0.1:{grpc_port}", "--http-addr", f"127.0.0.1:{http_port}",
           "--extproc-addr", f"127.0.0.1:{extproc_port}",
           "--cache-config", str(cache_rules(tmp_path)), *args]
    log_path = tmp_path / f"rls-{grpc_port}.log"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RLS_")}
    full_env.update(env or {})
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                                cwd=str(ROOT))
    rls = RlsProcess(proc, grpc_port, http_port, log_path, extproc_port)
    try:
        wait_until(lambda: http_get(rls.http_url + "/healthcheck")[0] == 200, 30,
                   "rls /healthcheck", rls.log, alive=lambda: proc.poll() is None)
    except BaseException:
        rls.stop()
        raise
    return rls


def loop_lags(rls: RlsProcess) -> dict[float, float]:
    """rls_event_loop_lag_seconds: late ticks so far, by bucket bound (cumulative)."""
    body = http_get(rls.http_url + "/metrics")[1].decode()
    return {float(s.labels["le"]): s.value
            for family in text_string_to_metric_families(body) for s in family.samples
            if s.name == "rls_event_loop_lag_seconds_bucket"}


def longest_stall(rls: RlsProcess, since: dict[float, float]) -> str:
    """The longest event-loop stall since the `loop_lags` snapshot `since`, rounded up to a
    bucket bound ("> 500 ms" above the last one): a figure, never asserted (the machine's
    load shows in it)."""
    now = loop_lags(rls)
    late = {bound: now[bound] - since.get(bound, 0) for bound in now}
    total = late[float("inf")]
    bound = min(b for b, count in late.items() if count == total)
    return "> 500 ms" if bound == float("inf") else f"<= {bound * 1000:g} ms"


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def assert_no_traceback(rls: RlsProcess) -> None:
    log = rls.log()
    assert "Traceback" not in log and "Unexpected [" not in log, log[-4000:]


def fresh_channel(addr: str) -> grpc.Channel:
    """A channel on a connection of its own (grpc shares one per target by default)."""
    return grpc.insecure_channel(addr, options=[("grpc.use_local_subchannel_pool", 1)])


def assert_serving(rls: RlsProcess, deadline: float = 10) -> None:
    """The process is alive and answers a health check on a fresh connection in time."""
    assert rls.proc.poll() is None, rls.log()[-4000:]
    with fresh_channel(rls.grpc_addr) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=deadline)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def code_of(call: Callable[[], object]) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def process_raw(addr: str, messages: Iterable[bytes], timeout: float = 10,
                metadata: list[tuple[str, str]] | None = None,
                ) -> tuple[grpc.StatusCode, list[pb.ProcessingResponse]]:
    """One ext_proc stream of raw messages: its final status and the replies it got."""
    replies: list[pb.ProcessingResponse] = []
    with grpc.insecure_channel(addr, options=[
            ("grpc.max_send_message_length", 64 << 20)]) as channel:
        stream = channel.stream_stream(
            PROCESS, response_deserializer=pb.ProcessingResponse.FromString)
        try:
            for reply in stream(iter(list(messages)), timeout=timeout, metadata=metadata):
                replies.append(reply)
        except grpc.RpcError as exc:
            return exc.code(), replies
    return grpc.StatusCode.OK, replies


def process(addr: str, messages: Iterable[pb.ProcessingRequest], **kwargs: object,
            ) -> tuple[grpc.StatusCode, list[pb.ProcessingResponse]]:
    return process_raw(addr, [m.SerializeToString() for m in messages], **kwargs)  # type: ignore[arg-type]


def cache_metric(rls: RlsProcess, name: str, **labels: str) -> float:
    return metric(rls.http_url, name, **labels)
