"""A real Prometheus (Debian's `prometheus` package) for the tests, and a small ext_proc client.

The package provides `prometheus` and `promtool`; scripts/install-test-deps.sh installs it (the
tests fail, never skip, without it).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml
from conftest import free_port, wait_until
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from support.processes import stop_process
from support.system import require_binary

from rls.response_cache.config import API_ATTRIBUTE
from rls.services.extproc import ATTRIBUTES

CHART_FILES = Path(__file__).resolve().parents[2] / "helm" / "rls" / "files"
RULES_FILE = CHART_FILES / "prometheus-rules.yaml"
DASHBOARD_FILE = CHART_FILES / "grafana-dashboard.json"


def prometheus_binaries() -> tuple[str, str]:
    """(prometheus, promtool), both from Debian's prometheus package."""
    return require_binary("prometheus", "prometheus"), require_binary("promtool", "prometheus")


@dataclass
class Prometheus:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, **params: str) -> Any:
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        with urllib.request.urlopen(self.url + path + query, timeout=10) as resp:
            payload = json.loads(resp.read())
        assert payload["status"] == "success", payload
        return payload["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; the result vector (empty when the expression has no data)."""
        data = self.get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", (expr, data)
        return data["result"]

    def stop(self) -> None:
        stop_process(self.proc, 10)


def start_prometheus(binary: str, workdir: Path, targets: list[str],
                     rule_files: list[Path], labels: dict[str, str] | None = None) -> Prometheus:
    """Scrape `targets` (host:port of rls admin) every second; evaluate rules every second.

    `labels` are added to every scraped series, as Kubernetes service discovery adds the pod's
    labels (`app.kubernetes.io/component: ratelimit` becomes `app_kubernetes_io_component`)."""
    static: dict[str, object] = {"targets": targets}
    if labels:
        static["labels"] = labels
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms",
                   "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [{"job_name": "rls", "static_configs": [static]}],
    }
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    log_path = workdir / "prometheus.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={config_path}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT,
        )
    prom = Prometheus(proc, port, log_path)

    def ready() -> bool:
        with urllib.request.urlopen(prom.url + "/-/ready", timeout=2) as resp:
            return resp.status == 200

    try:
        wait_until(ready, timeout=30, what="prometheus /-/ready")
    except TimeoutError:
        prom.stop()
        raise AssertionError(f"prometheus did not start:\n{log_path.read_text()}") from None
    return prom


# --------------------------------------------------------------------------- ext_proc client


SEND = ProcessingMode.SEND


def _headers(target: Any, headers: list[tuple[str, str]]) -> None:
    for name, value in headers:
        h = target.headers.add()
        h.key = name
        h.raw_value = value.encode()


async def _cache_get(addr: str, api: str, path: str, body: bytes) -> str:
    """One GET through the ext_proc stream as Envoy drives it; "hit", "miss" or "upstream"."""
    async with grpc.aio.insecure_channel(addr) as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process()

        async def reply() -> pb.ProcessingResponse:
            while True:
                msg = await call.read()
                assert msg is not grpc.aio.EOF, "ext_proc stream ended early"
                if not msg.HasField("override_message_timeout"):
                    return msg

        req = pb.ProcessingRequest()
        _headers(req.request_headers.headers,
                 [(":authority", "gw"), (":path", path), (":method", "GET"), (":scheme", "http")])
        req.request_headers.end_of_stream = True
        req.attributes[ATTRIBUTES].fields[API_ATTRIBUTE].string_value = api
        await call.write(req)
        first = await reply()
        if first.HasField("immediate_response"):
            await call.done_writing()
            return "hit"
        if first.mode_override.response_header_mode != SEND:
            await call.done_writing()  # lookup failed or skipped: upstream, nothing to store
            return "upstream"
        resp = pb.ProcessingRequest()
        _headers(resp.response_headers.headers,
                 [(":status", "200"), ("content-type", "text/plain"),
                  ("content-length", str(len(body)))])
        await call.write(resp)
        second = await reply()
        outcome = "miss" if second.mode_override.response_body_mode else "upstream"
        if outcome == "miss":
            chunk = pb.ProcessingRequest()
            chunk.response_body.body = body
            chunk.response_body.end_of_stream = True
            await call.write(chunk)
            await reply()
        await call.done_writing()
        return outcome


def cache_get(addr: str, api: str, path: str, body: bytes = b"hello") -> str:
    return asyncio.run(_cache_get(addr, api, path, body))
