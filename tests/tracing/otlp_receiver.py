"""An OTLP trace receiver for the tests: gRPC (`TraceService/Export`) and HTTP (`/v1/traces`),
decoding with opentelemetry-proto, keeping every span it is sent.

Envoy's OpenTelemetry tracer and rls export to the same receiver, so a test reads one trace
across both. A "blackhole" is a listening socket that never accepts: a collector that takes
connections but never answers, the slowest a collector can be.
"""

from __future__ import annotations

import socket
import threading
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from support.net import free_port
from support.waiting import wait_until

from rls.tracing import otlp_compat

otlp_compat.install()  # xds-protos may have overwritten opentelemetry-proto's modules
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2  # noqa: E402
from opentelemetry.proto.common.v1 import common_pb2  # noqa: E402

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


@dataclass(frozen=True)
class SpanSeen:
    trace_id: str  # hex
    span_id: str
    parent_id: str  # "" for a root span
    name: str
    service: str  # the resource's service.name
    kind: int
    attributes: dict[str, Any] = field(hash=False)
    resource: dict[str, Any] = field(hash=False)


def _value(v: common_pb2.AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind is not None else None


def _attrs(items: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in items}


class OtlpReceiver:
    """Both transports on free loopback ports; `spans` in arrival order."""

    def __init__(self) -> None:
        self.spans: list[SpanSeen] = []
        self.requests = 0
        self._lock = threading.Lock()
        self.grpc_port = free_port()
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.unary_unary_rpc_method_handler(self._export_grpc)
        self._grpc.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(
                "opentelemetry.proto.collector.trace.v1.TraceService", {"Export": handler}),)
        )
        self._grpc.add_insecure_port(f"127.0.0.1:{self.grpc_port}")
        receiver = self

        class Http(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                status = 200 if self.path == "/v1/traces" else 404
                if status == 200:
                    receiver._take(body)
                self.send_response(status)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Http)
        self.http_port = self._http.server_address[1]

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        """OTEL_EXPORTER_OTLP_ENDPOINT for OTLP/HTTP (the exporter appends /v1/traces)."""
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> OtlpReceiver:
        self._grpc.start()
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._grpc.stop(grace=None)
        self._http.shutdown()
        self._http.server_close()

    def _export_grpc(self, data: bytes, context: grpc.ServicerContext) -> bytes:
        self._take(data)
        return b""  # an empty ExportTraceServiceResponse

    def _take(self, data: bytes) -> None:
        request = trace_service_pb2.ExportTraceServiceRequest.FromString(data)
        seen = []
        for rs in request.resource_spans:
            resource = _attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    seen.append(SpanSeen(
                        s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.name,
                        str(resource.get("service.name", "")), s.kind, _attrs(s.attributes),
                        resource,
                    ))
        with self._lock:
            self.requests += 1
            self.spans.extend(seen)

    def named(self, name: str, service: str | None = None) -> list[SpanSeen]:
        with self._lock:
            return [s for s in self.spans
                    if s.name == name and (service is None or s.service == service)]

    def in_trace(self, trace_id: str) -> list[SpanSeen]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(self, name: str, count: int = 1, timeout: float = 20.0) -> list[SpanSeen]:
        wait_until(lambda: len(self.named(name)) >= count, timeout=timeout,
                   what=f"{count} span(s) named {name!r} at the OTLP receiver")
        return self.named(name)


class Blackhole:
    """A TCP port that completes handshakes (the kernel's backlog) and never answers."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(1024)
        self.port = self._sock.getsockname()[1]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._sock.close()
