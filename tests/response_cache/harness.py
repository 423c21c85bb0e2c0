"""Plumbing for the cache end-to-end tests: a scriptable backend, the ExtProc servicer on its own
event loop in a thread (with a stub RateLimitService and the cache admin routes), and Envoy on
envoy/gateway-cache.yaml rewritten to free ports. No fixtures here (see conftest.py).
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import random
import subprocess
import threading
import time
import urllib.request
from collections.abc import Coroutine
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import grpc
import yaml
from aiohttp import web
from e2e.harness import Response as Response  # re-exported for the cache tests
from e2e.harness import http_request as http_request  # re-exported
from envoy.service.ratelimit.v3 import rls_pb2
from prometheus_client import CollectorRegistry
from support.envoy import find_envoy as find_envoy  # re-exported
from support.processes import stop_process
from support.waiting import wait_until as poll  # the cache suites' name

from rls.admin.response_cache import add_cache_routes
from rls.demo import socket_addresses
from rls.response_cache.cache import ResponseCache
from rls.services.extproc import ExtProcService, build_cache

T = TypeVar("T")
request = http_request  # one HTTP helper for both e2e suites
ROOT = Path(__file__).resolve().parents[2]
GATEWAY = ROOT / "envoy" / "gateway-cache.yaml"
# The gateway's rate-limit and ext_proc ports (rls serve: --grpc-addr, --extproc-addr); the
# harness serves both on one port.
RLS_PORT, EXTPROC_PORT, LISTENER_PORT, ADMIN_PORT = 8081, 8082, 10000, 9901
BACKEND_PORTS = (9001, 9002, 9003)


# --------------------------------------------------------------------------- backend


class Backend:
    """HTTP/1.1 upstream that counts calls. Request headers script the response:
    `x-test-size` (body bytes), `x-test-chunked`, `x-test-status`, `x-test-delay-ms`,
    `x-test-header` ("name: value" pairs separated by "|")."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                with backend.lock:
                    backend.calls += 1
                    n = backend.calls
                delay = int(self.headers.get("x-test-delay-ms") or 0)
                if delay:
                    time.sleep(delay / 1000)
                digest = hashlib.sha256(body).hexdigest()[:12]
                out = f'{{"call": {n}, "path": "{self.path}", "body": "{digest}"}}\n'.encode()
                size = int(self.headers.get("x-test-size") or 0)
                if size:
                    out = (out * (size // len(out) + 1))[:size]
                self.send_response(int(self.headers.get("x-test-status") or 200))
                self.send_header("content-type", "application/json; charset=utf-8")
                self.send_header("x-backend", "yes")
                self.send_header("keep-alive", "timeout=5")
                for pair in filter(None, (self.headers.get("x-test-header") or "").split("|")):
                    name, _, value = pair.partition(":")
                    self.send_header(name.strip(), value.strip())
                if self.headers.get("x-test-chunked"):
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    for i in range(0, len(out), 65536):
                        chunk = out[i : i + 65536]
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.write(b"0\r\n\r\n")
                else:
                    self.send_header("content-length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)

            do_GET = do_POST = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # Envoy opens a connection per request in a burst

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --------------------------------------------------------------------------- rls side


_OK = rls_pb2.RateLimitResponse(overall_code=rls_pb2.RateLimitResponse.OK).SerializeToString()


class CacheServer:
    """ExtProcService + stub RateLimitService on one gRPC port, cache admin on an HTTP port,
    all on an event loop of their own in a daemon thread (the tests stay synchronous)."""

    def __init__(self, cache_config: Path, store_url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.registry = CollectorRegistry()
        self.servicer: ExtProcService
        self.cache: ResponseCache
        self.grpc_port = 0
        self.admin_port = 0
        # What Envoy's ratelimit filters asked the stub (hits_addend included), in order.
        self.rate_limit_requests: list[rls_pb2.RateLimitRequest] = []
        self.run(self._start(str(cache_config), store_url), timeout=15)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 10) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self, path: str, store_url: str) -> None:
        self.servicer, self.cache = build_cache(path, store_url, self.registry)
        # Buffered bodies arrive as one message: allow more than Envoy's buffer limit.
        self.server = grpc.aio.server(options=[("grpc.max_receive_message_length", 16 << 20)])
        stub = grpc.method_handlers_generic_handler(
            "envoy.service.ratelimit.v3.RateLimitService",
            {"ShouldRateLimit": grpc.unary_unary_rpc_method_handler(self._rate_limit_ok)},
        )
        self.server.add_generic_rpc_handlers((self.servicer.handler(), stub))
        self.grpc_port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        app = web.Application()
        add_cache_routes(app, self.cache)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.admin_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def _rate_limit_ok(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.rate_limit_requests.append(rls_pb2.RateLimitRequest.FromString(request))
        return _OK

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def metric(self, name: str, **labels: str) -> float:
        total = 0.0
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name == name and labels.items() <= sample.labels.items():
                    total += sample.value
        return total

    def stop(self) -> None:
        async def _stop() -> None:
            await self.server.stop(1)
            await self.runner.cleanup()
            await self.cache.close()

        try:
            self.run(_stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)


# --------------------------------------------------------------------------- Envoy




def gateway_config(ports: dict[int, int], buffer_limit: int | None = None) -> dict[str, Any]:
    """envoy/gateway-cache.yaml with every port mapped (all must occur in the file)."""
    config = copy.deepcopy(yaml.safe_load(GATEWAY.read_text()))
    seen = set()
    for sa in socket_addresses(config):
        port = int(sa["port_value"])
        assert port in ports, f"unexpected port {port} in {GATEWAY}"
        seen.add(port)
        sa["port_value"] = ports[port]
    assert seen == set(ports), f"ports {set(ports) - seen} not in {GATEWAY}"
    if buffer_limit is not None:
        for listener in config["static_resources"]["listeners"]:
            listener["per_connection_buffer_limit_bytes"] = buffer_limit
    return config


@dataclass
class Envoy:
    proc: subprocess.Popen[bytes]
    port: int
    admin_port: int
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stats(self, prefix: str) -> dict[str, int]:
        url = f"http://127.0.0.1:{self.admin_port}/stats?filter={prefix}"
        with urllib.request.urlopen(url, timeout=2) as resp:
            text = resp.read().decode()
        out = {}
        for line in text.splitlines():
            name, _, value = line.partition(": ")
            if value.strip().isdigit():
                out[name] = int(value)
        return out

    def stop(self) -> None:
        stop_process(self.proc, 10)


def start_envoy(binary: str, config: dict[str, Any], workdir: Path, port: int,
                admin_port: int) -> Envoy:
    path = workdir / "envoy-cache.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    log_path = workdir / "envoy-cache.log"
    cmd = [binary, "-c", str(path), "--base-id", str(random.randint(1, 10**8)),
           "--concurrency", "1", "--log-level", "warning"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    envoy = Envoy(proc, port, admin_port, log_path)

    def ready() -> bool:
        assert proc.poll() is None, f"envoy exited:\n{envoy.log()}"
        url = f"http://127.0.0.1:{admin_port}/ready"
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status == 200

    try:
        poll(ready, 20, "Envoy /ready", envoy.log)
    except BaseException:
        envoy.stop()
        raise
    return envoy


