"""Why a listener could not open, in words that name the flag to change.

gRPC's own error for a taken port is `Failed to bind to address …; set GRPC_VERBOSITY=debug
…`: it does not say why. After gRPC (or aiohttp) failed, the same address is bound once with a
plain socket, set up as gRPC sets up its own (SO_REUSEADDR), only to read the operating
system's reason (address in use, permission denied), and the message names the flag that
sets the address (`--grpc-addr`, `--extproc-addr`, `--http-addr`).
"""

from __future__ import annotations

import errno
import socket

# Each listener's flag, by the name the server gives it in its messages.
FLAGS = {
    "gRPC": "--grpc-addr", "ext_proc": "--extproc-addr", "admin": "--http-addr",
    "Prometheus": "--prometheus-addr",
}

_REASONS = {
    errno.EADDRINUSE: "port {port} is already in use (another rls, or another program, "
    "listens on it)",
    errno.EACCES: "no permission to listen on port {port} (ports below 1024 need privileges)",
    errno.EADDRNOTAVAIL: "{host} is not an address of this machine",
}


def bind_errno(host: str, port: int) -> int | None:
    """The errno of binding `host:port` now with a plain socket; None when it binds (then
    the listener failed for another reason) or the host does not resolve."""
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (OSError, UnicodeError):
        return None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            return exc.errno
    return None


def cannot_listen(addr: str, what: str, error: BaseException) -> str:
    """`cannot listen on <addr> (<what>): <reason>; <what to do, naming the flag>`."""
    flag = FLAGS.get(what, "the listen address")
    host, _, port_text = addr.rpartition(":")
    host = host.strip("[]")
    code = getattr(error, "errno", None)
    if code not in _REASONS and port_text.isdigit():
        code = bind_errno(host, int(port_text))
    if code in _REASONS:
        reason = _REASONS[code].format(host=host, port=port_text)
        return f"cannot listen on {addr} ({what}): {reason}; choose another address with {flag}"
    return f"cannot listen on {addr} ({what}): {error}; check {flag}"
