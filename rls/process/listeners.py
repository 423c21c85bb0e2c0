"""Where rls listens: the HTTP listeners, and why a listener could not open.

The admin API listens on --http-addr and, with --prometheus-addr, a second listener serves
nothing but the Prometheus metrics: the reference's `USE_PROMETHEUS` / `PROMETHEUS_ADDR` /
`PROMETHEUS_PATH` (Envoy Gateway scrapes `:19001`), a read-only port that may face the network,
so it carries only the one route, served by the admin's own /metrics handler (the same
exposition, summed over the workers under --workers). The gRPC listeners are opened by the
server (rls.process.server), with their TLS credentials.

When a listener cannot open, gRPC's own error for a taken port is `Failed to bind to address …;
set GRPC_VERBOSITY=debug …`: it does not say why. After gRPC (or aiohttp) failed, the same
address is bound once with a plain socket, set up as gRPC sets up its own (SO_REUSEADDR), only to
read the operating system's reason (address in use, permission denied), and the message names
the flag that sets the address (`--grpc-addr`, `--extproc-addr`, `--http-addr`).
"""

from __future__ import annotations

import errno
import logging
import socket

from aiohttp import web

from rls.admin.app import RUNNER_OPTIONS, AdminState, metrics
from rls.settings import Settings

log = logging.getLogger("rls.server")

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


def split_addr(addr: str) -> tuple[str, int]:
    """`host:port` (`[v6]:port`; an empty host is every interface) as (host, port)."""
    host, _, port = addr.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)



async def start_site(
    app: web.Application, addr: str, what: str, reuse_port: bool
) -> web.AppRunner | None:
    """Serve `app` on `addr` (`host:port`; an empty host is every interface); None, logged,
    when the address cannot be bound."""
    runner = web.AppRunner(app, access_log=None, **RUNNER_OPTIONS)
    await runner.setup()
    host, port = split_addr(addr)
    site = web.TCPSite(runner, host, port, reuse_port=reuse_port)
    try:
        await site.start()
    except OSError as exc:
        log.error("%s", cannot_listen(addr, what, exc))
        await runner.cleanup()
        return None
    return runner


def prometheus_app(state: AdminState, path: str) -> web.Application:
    """GET `path` -> the metrics; every other request 404 (the admin's middlewares are not
    needed: nothing here reads a body or changes state)."""
    app = web.Application()
    app["state"] = state
    app.router.add_get(path, metrics)
    return app


async def start_http(
    admin_app: web.Application, state: AdminState, settings: Settings, reuse_port: bool
) -> list[web.AppRunner] | None:
    """The admin listener, then the Prometheus one if configured; None (nothing left
    listening) when either cannot bind."""
    admin = await start_site(admin_app, settings.http_addr, "admin", reuse_port)
    if admin is None:
        return None
    if not settings.prometheus_addr:
        return [admin]
    app = prometheus_app(state, settings.prometheus_path)
    prometheus = await start_site(app, settings.prometheus_addr, "Prometheus", reuse_port)
    if prometheus is None:
        await admin.cleanup()
        return None
    log.info("Prometheus metrics on %s%s", settings.prometheus_addr, settings.prometheus_path)
    return [admin, prometheus]
