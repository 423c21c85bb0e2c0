"""The demo's ports: the deployment defaults of envoy/gateway.yaml, or free ones.

Chosen before anything starts, so a port in use is one clear error (exit 2) naming its flag,
not a half-started demo.
"""

from __future__ import annotations

import argparse
import socket
from dataclasses import dataclass

from rls.demo.errors import DemoError

# Ports of envoy/gateway.yaml, by role (the deployment defaults).
LISTENER_PORT = 10000
ENVOY_ADMIN_PORT = 9901
GRPC_PORT = 8081
EXTPROC_PORT = 8082  # envoy/gateway-cache.yaml's cache_service (rls --extproc-addr)
HTTP_PORT = 8080
BACKEND_PORT = 9001

_FLAGS = {"listener": "--listener-port", "envoy_admin": "--envoy-admin-port",
          "grpc": "--grpc-port", "http": "--http-port"}


def free_port() -> int:
    """A port the kernel has just handed out on 127.0.0.1 (free now, not reserved)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    """Whether rls or Envoy could listen on 127.0.0.1:`port` now.

    SO_REUSEADDR, as both set it: a connection of an earlier run in TIME_WAIT does not stop
    them, so it must not count as "in use"; a socket listening on the port still does.
    """
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class Ports:
    """Every port of one demo run, by role."""

    listener: int
    envoy_admin: int
    grpc: int
    http: int  # rls admin; Envoy's configs do not name it
    backends: list[int]
    extproc: int = EXTPROC_PORT  # rls's ext_proc listener (the --cache demo)

    def mapping(self, upstream: list[int]) -> dict[int, int]:
        """Default port -> this run's port, for `rewrite_ports` on the Envoy config
        (`upstream`: the config's backend endpoint ports, in order)."""
        mapping = {LISTENER_PORT: self.listener, ENVOY_ADMIN_PORT: self.envoy_admin,
                   GRPC_PORT: self.grpc, EXTPROC_PORT: self.extproc}
        mapping.update(dict(zip(upstream, self.backends, strict=True)))
        return mapping


def choose_ports(args: argparse.Namespace, n_backends: int) -> Ports:
    """Free ports (`--free-ports`), else the port flags, all checked free up front."""
    if args.free_ports:
        return Ports(free_port(), free_port(), free_port(), free_port(),
                     [free_port() for _ in range(n_backends)], free_port())
    ports = Ports(args.listener_port, args.envoy_admin_port, args.grpc_port, args.http_port,
                  [args.backend_port + i for i in range(n_backends)])
    roles = {"listener": ports.listener, "envoy_admin": ports.envoy_admin,
             "grpc": ports.grpc, "http": ports.http}
    taken = [f"{port} ({_FLAGS[role]})" for role, port in roles.items()
             if not port_is_free(port)]
    taken += [f"{port} (--backend-port)" for port in ports.backends if not port_is_free(port)]
    if args.cache and not port_is_free(ports.extproc):
        taken.append(f"{ports.extproc} (rls ext_proc)")
    if taken:
        raise DemoError(
            f"port(s) in use on 127.0.0.1: {', '.join(taken)}; stop what uses them, or "
            "run with --free-ports or other port flags"
        )
    return ports
