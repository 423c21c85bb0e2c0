#!/usr/bin/env python3
"""A minimal xDS management server for rls (or envoyproxy/ratelimit) with CONFIG_TYPE=GRPC_XDS_SOTW.

It serves the Aggregated Discovery Service (State of the World) with one RateLimitConfig
resource per descriptor YAML file, and pushes a new version to every connected client when a
file changes (checked every second). An example to read and to try rls's xDS path with; a
real deployment gets its resources from its control plane (Envoy Gateway, go-control-plane).

    python scripts/xds_server.py --port 18000 scripts/xds_example.yaml [more files or dirs]

    CONFIG_TYPE=GRPC_XDS_SOTW CONFIG_GRPC_XDS_SERVER_URL=127.0.0.1:18000 rls serve

Plaintext by default. `--tls-cert` / `--tls-key` serve TLS (rls then sets
CONFIG_GRPC_XDS_SERVER_USE_TLS=true and trusts the certificate's CA); `--client-ca` also
requires a client certificate signed by that CA (mTLS, as Envoy Gateway's controller does;
rls presents CONFIG_GRPC_XDS_CLIENT_TLS_CERT / _KEY). docs/envoy-gateway.md walks through it.

A file holds what the resource holds: `domain` and `descriptors` with `key`, `value`,
`rate_limit` (`unit`, `requests_per_unit`, `unlimited`, `name`, `replaces`), `shadow_mode`,
`detailed_metric`, `quota_mode`, `metadata`. rls's YAML extensions (algorithm, burst,
candidates...) have no field in the resource: a file using them is refused with its name.
The resource's name is the file's path. Serves every node id (one snapshot for all).
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import yaml
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import any_pb2, json_format

from rls.config.xds.convert import TYPE_URL
from rls.config.xds.proto import rls_conf_pb2 as _generated

pb: Any = _generated  # generated module: no type information

log = logging.getLogger("xds_server")


def yaml_files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            out += sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml"))
        else:
            out.append(path)
    return out


def upper_units(descriptors: Any) -> Any:
    """Units as the enum's names (`minute` -> `MINUTE`; YAML files take either case)."""
    for descriptor in descriptors or []:
        limit = descriptor.get("rate_limit") if isinstance(descriptor, dict) else None
        if isinstance(limit, dict) and isinstance(limit.get("unit"), str):
            limit["unit"] = limit["unit"].upper()
        if isinstance(descriptor, dict):
            upper_units(descriptor.get("descriptors"))
    return descriptors or []


def load_resources(paths: list[str]) -> list[any_pb2.Any]:
    """One packed RateLimitConfig per file; ValueError naming the file that does not fit."""
    resources = []
    for file in yaml_files(paths):
        doc = yaml.safe_load(file.read_text()) or {}
        if not isinstance(doc, dict) or "domain" not in doc:
            log.warning("%s: skipped: not a descriptor file (no domain)", file)
            continue
        resource = pb.RateLimitConfig(name=str(file))
        try:
            json_format.ParseDict(
                {"domain": doc["domain"], "descriptors": upper_units(doc.get("descriptors"))},
                resource,
            )
        except json_format.ParseError as exc:
            raise ValueError(f"{file}: {exc}") from None
        packed = any_pb2.Any()
        packed.Pack(resource)
        resources.append(packed)
    return resources


class Snapshots(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):  # type: ignore[misc]
    """The current version for every stream; a new one is pushed to each open stream."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.version = 0
        self.resources: list[any_pb2.Any] = []
        self.streams: list[queue.Queue[discovery_pb2.DiscoveryResponse]] = []

    def _response(self) -> discovery_pb2.DiscoveryResponse:
        return discovery_pb2.DiscoveryResponse(
            version_info=str(self.version), resources=self.resources, type_url=TYPE_URL,
            nonce=f"{self.version}-{time.monotonic_ns()}",
        )

    def publish(self, resources: list[any_pb2.Any]) -> None:
        with self.lock:
            self.version += 1
            self.resources = resources
            for stream in self.streams:
                stream.put(self._response())
        log.info("version %d: %d resource(s)", self.version, len(resources))

    def _note(self, request: discovery_pb2.DiscoveryRequest,
              out: queue.Queue[discovery_pb2.DiscoveryResponse]) -> None:
        """Log an ACK or a NACK; answer a stream's first request with the current version."""
        if request.HasField("error_detail"):
            log.warning("node %s NACKed: %s", request.node.id, request.error_detail.message)
        elif request.response_nonce:
            log.info("node %s ACKed version %s", request.node.id, request.version_info)
        else:
            log.info("node %s connected", request.node.id)
            with self.lock:
                out.put(self._response())

    def StreamAggregatedResources(  # the gRPC method's name
        self, requests: Iterator[discovery_pb2.DiscoveryRequest], context: grpc.ServicerContext
    ) -> Iterator[discovery_pb2.DiscoveryResponse]:
        out: queue.Queue[discovery_pb2.DiscoveryResponse] = queue.Queue()

        def read() -> None:
            node = "?"
            try:
                for request in requests:
                    node = request.node.id or node
                    self._note(request, out)
            except grpc.RpcError:  # the client went away: the stream ends, nothing to report
                pass
            log.info("node %s disconnected", node)

        threading.Thread(target=read, daemon=True).start()
        with self.lock:
            self.streams.append(out)
        try:
            while context.is_active():
                try:
                    yield out.get(timeout=1.0)
                except queue.Empty:
                    continue
        finally:
            with self.lock:
                self.streams.remove(out)


def fingerprint(paths: list[str]) -> tuple[tuple[str, int, int], ...]:
    return tuple((str(p), st.st_mtime_ns, st.st_size)
                 for p in yaml_files(paths) for st in [os.stat(p)])


def credentials(args: argparse.Namespace) -> grpc.ServerCredentials | None:
    """TLS credentials from --tls-cert/--tls-key (and --client-ca: client certificates
    required and verified); None for plaintext. An unreadable file exits naming the flag."""
    if not args.tls_cert and not args.tls_key:
        if args.client_ca:
            raise SystemExit("xds_server.py: --client-ca needs --tls-cert and --tls-key")
        return None
    if not (args.tls_cert and args.tls_key):
        raise SystemExit("xds_server.py: --tls-cert and --tls-key go together")
    files: dict[str, bytes] = {}
    for flag in ("tls_cert", "tls_key", "client_ca"):
        path = getattr(args, flag)
        if path:
            try:
                files[flag] = Path(path).read_bytes()
            except OSError as exc:
                raise SystemExit(f"xds_server.py: --{flag.replace('_', '-')} {path}: "
                                 f"{exc.strerror or exc}") from None
    ca = files.get("client_ca")
    return grpc.ssl_server_credentials(
        [(files["tls_key"], files["tls_cert"])], root_certificates=ca,
        require_client_auth=ca is not None,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="descriptor YAML files or directories")
    parser.add_argument("--port", type=int, default=18000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--tls-cert", help="serve TLS with this certificate (PEM chain)")
    parser.add_argument("--tls-key", help="its private key (PEM)")
    parser.add_argument("--client-ca", help="require client certificates signed by this CA "
                        "(PEM): mTLS")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    tls = credentials(args)
    snapshots = Snapshots()
    try:
        snapshots.publish(load_resources(args.paths))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise SystemExit(f"xds_server.py: {exc}") from None
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(snapshots, server)
    address = f"{args.host}:{args.port}"
    if tls is None:
        server.add_insecure_port(address)
    else:
        server.add_secure_port(address, tls)
    server.start()
    log.info("serving ADS on %s (%s)", address,
             "plaintext" if tls is None else
             f"mTLS, client certificates from {args.client_ca}" if args.client_ca else "TLS")
    seen: Any = fingerprint(args.paths)
    while True:
        time.sleep(1.0)
        now = fingerprint(args.paths)
        if now != seen:
            seen = now
            try:
                snapshots.publish(load_resources(args.paths))
            except (OSError, ValueError, yaml.YAMLError) as exc:
                log.error("not published: %s", exc)


if __name__ == "__main__":
    main()
