"""The HTTP listeners: the admin API on --http-addr and, with --prometheus-addr, a second
listener that serves nothing but the Prometheus metrics.

The second listener is the reference's `USE_PROMETHEUS` / `PROMETHEUS_ADDR` /
`PROMETHEUS_PATH` (Envoy Gateway scrapes `:19001`): a read-only port that may face the
network, so it carries only the one route, served by the admin's own /metrics handler (the
same exposition, summed over the workers under --workers).
"""

from __future__ import annotations

import logging

from aiohttp import web

from rls.admin.app import RUNNER_OPTIONS, AdminState, metrics
from rls.listen_errors import cannot_listen
from rls.settings import Settings

log = logging.getLogger("rls.server")


async def start_site(
    app: web.Application, addr: str, what: str, reuse_port: bool
) -> web.AppRunner | None:
    """Serve `app` on `addr` (`host:port`; an empty host is every interface); None, logged,
    when the address cannot be bound."""
    runner = web.AppRunner(app, access_log=None, **RUNNER_OPTIONS)
    await runner.setup()
    host, _, port = addr.rpartition(":")
    site = web.TCPSite(runner, host.strip("[]") or "0.0.0.0", int(port), reuse_port=reuse_port)
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
