"""An in-test xDS management server (ADS, State of the World) for rls's xDS client.

Real gRPC (grpcio, threads) serving envoy.service.discovery.v3.AggregatedDiscoveryService on a
free port, with resources from rls's compiled RateLimitConfig proto. Like go-control-plane's
snapshot cache it answers a stream's first request with the current snapshot and pushes every
new snapshot to every open stream; it records every request (ACKs, NACKs) and each stream's
metadata. Hostile modes: `silent` (accepts streams, never answers) and `push_raw` (any
response, e.g. garbage in an Any).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import any_pb2
from support.net import free_port
from support.waiting import wait_until

from rls.config.xds.convert import TYPE_URL
from rls.config.xds.proto import rls_conf_pb2 as _generated

pb: Any = _generated


def pack(resource: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(resource)
    return packed


def limit(key: str, unit: str, rpu: int, **fields: Any) -> Any:
    """A top-level descriptor `key` with `rpu` requests per `unit` (SECOND, MINUTE...)."""
    return pb.RateLimitDescriptor(
        key=key, rate_limit=pb.RateLimitPolicy(unit=pb.RateLimitUnit.Value(unit),
                                               requests_per_unit=rpu), **fields
    )


def domain(name: str, *descriptors: Any, resource_name: str | None = None) -> Any:
    return pb.RateLimitConfig(name=resource_name or name, domain=name, descriptors=descriptors)


@dataclass
class TlsFiles:
    """PEM paths of the server's certificate, key and (for mTLS) the client CA."""

    cert: str
    key: str
    client_ca: str | None = None


@dataclass
class _Stream:
    out: queue.Queue[discovery_pb2.DiscoveryResponse | None] = field(default_factory=queue.Queue)


class AdsServer:
    def __init__(self, port: int | None = None, tls: TlsFiles | None = None) -> None:
        self.port = port or free_port()
        self.tls = tls
        self.lock = threading.Lock()
        self.version = ""
        self.resources: list[any_pb2.Any] | None = None  # None: no snapshot yet
        self.requests: list[discovery_pb2.DiscoveryRequest] = []
        self.metadata: list[dict[str, str]] = []
        self.streams: list[_Stream] = []
        self.silent = False
        self.sent = 0
        self._nonce = 0
        self._server: grpc.Server | None = None

    # -- life cycle ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> AdsServer:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16),
                             options=[("grpc.max_send_message_length", 256 << 20)])
        ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(_Servicer(self), server)
        if self.tls is None:
            server.add_insecure_port(self.url)
        else:
            server.add_secure_port(self.url, self._credentials())
        server.start()
        self._server = server
        return self

    def _credentials(self) -> grpc.ServerCredentials:
        assert self.tls is not None
        with open(self.tls.cert, "rb") as c, open(self.tls.key, "rb") as k:
            pair = (k.read(), c.read())
        ca = open(self.tls.client_ca, "rb").read() if self.tls.client_ca else None
        return grpc.ssl_server_credentials(
            [pair], root_certificates=ca, require_client_auth=ca is not None
        )

    def stop(self) -> None:
        if self._server is not None:
            with self.lock:
                for stream in self.streams:
                    stream.out.put(None)
                self.streams.clear()
            self._server.stop(grace=None).wait(5)
            self._server = None

    # -- snapshots -----------------------------------------------------------------------------

    def set_snapshot(self, version: str, resources: Sequence[Any]) -> None:
        """Make `resources` (RateLimitConfig messages, or Any) the snapshot and push it."""
        packed = [r if isinstance(r, any_pb2.Any) else pack(r) for r in resources]
        with self.lock:
            self.version, self.resources = version, packed
            for stream in self.streams:
                stream.out.put(self._response_locked())

    def push_raw(self, response: discovery_pb2.DiscoveryResponse) -> str:
        """Send `response` as is (a nonce is set) to every open stream; the nonce."""
        with self.lock:
            self._nonce += 1
            response.nonce = str(self._nonce)
            for stream in self.streams:
                stream.out.put(response)
            return response.nonce

    def _response_locked(self) -> discovery_pb2.DiscoveryResponse:
        self._nonce += 1
        return discovery_pb2.DiscoveryResponse(
            version_info=self.version, resources=self.resources or [], type_url=TYPE_URL,
            nonce=str(self._nonce),
        )

    # -- what rls said -------------------------------------------------------------------------

    def acks(self, version: str) -> list[discovery_pb2.DiscoveryRequest]:
        with self.lock:
            return [r for r in self.requests if r.response_nonce and r.version_info == version
                    and not r.HasField("error_detail")]

    def nacks(self) -> list[discovery_pb2.DiscoveryRequest]:
        with self.lock:
            return [r for r in self.requests if r.HasField("error_detail")]

    def wait_ack(self, version: str, timeout: float = 15.0) -> discovery_pb2.DiscoveryRequest:
        wait_until(lambda: self.acks(version), timeout, f"an ACK of version {version!r}")
        return self.acks(version)[-1]

    def wait_nack(self, count: int = 1, timeout: float = 15.0) -> discovery_pb2.DiscoveryRequest:
        wait_until(lambda: len(self.nacks()) >= count, timeout, f"{count} NACK(s)")
        return self.nacks()[count - 1]

    def open_streams(self) -> int:
        with self.lock:
            return len(self.streams)


class _Servicer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):  # type: ignore[misc]
    def __init__(self, owner: AdsServer) -> None:
        self.owner = owner

    def StreamAggregatedResources(
        self, request_iterator: Iterator[discovery_pb2.DiscoveryRequest],
        context: grpc.ServicerContext,
    ) -> Iterator[discovery_pb2.DiscoveryResponse]:
        owner, stream = self.owner, _Stream()
        with owner.lock:
            owner.streams.append(stream)
            owner.metadata.append({k: str(v) for k, v in context.invocation_metadata()})

        def read() -> None:
            try:
                for request in request_iterator:
                    with owner.lock:
                        owner.requests.append(request)
                        first = not request.response_nonce
                        if first and owner.resources is not None and not owner.silent:
                            stream.out.put(owner._response_locked())
            except grpc.RpcError:
                pass
            stream.out.put(None)

        threading.Thread(target=read, daemon=True).start()
        try:
            while context.is_active():
                try:
                    item = stream.out.get(timeout=0.1)
                except queue.Empty:
                    continue
                if item is None:
                    return
                owner.sent += 1
                yield item
        finally:
            with owner.lock:
                if stream in owner.streams:
                    owner.streams.remove(stream)
