"""Admin HTTP API (default 127.0.0.1:8080): health, metrics, config dump, /json decisions."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web
from envoy.service.ratelimit.v3 import rls_pb2
from google.protobuf import json_format
from prometheus_client import CONTENT_TYPE_LATEST

from rls.admin.auth import IDLE_SECONDS, MAX_BODY_BYTES, BadBody, guard, read_json
from rls.admin.frequency import add_freq_routes
from rls.admin.limit_counters import add_counter_routes
from rls.admin.switches import add_switch_routes, publish, switch_state
from rls.admin.top import add_top_routes
from rls.admin.usage import add_usage_routes
from rls.config.model import Limit, RateLimitConfig
from rls.core.limits import WINDOW_ALIGNED, WINDOW_ROLLING
from rls.engine.limiter import InvalidRequest
from rls.observability.metrics import Metrics
from rls.services.ratelimit import RateLimitService


class AdminState:
    """What the admin endpoints read; `draining` flips /healthcheck to 503 on shutdown."""

    def __init__(
        self,
        service: RateLimitService,
        metrics: Metrics,
        config: Callable[[], RateLimitConfig | None],
    ) -> None:
        self.service = service
        self.metrics = metrics
        self.config = config
        self.draining = False
        self.store_ready = True  # the server sets False until the store accepted rls
        # HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED: /healthcheck fails while no domain is loaded
        self.require_domain = False
        # Where the config comes from, for /rlconfig?format=json (the xDS client's status)
        self.config_source: Callable[[], dict[str, object]] | None = None
        # --workers: why a sibling worker slot fails /healthcheck (the server sets the
        # supervisor's report; a single process has no siblings)
        self.worker_problem: Callable[[], str | None] = lambda: None


# aiohttp server options of the admin listener (web.AppRunner keyword arguments): idle
# connections, and connections that dribble their request headers, are closed after
# IDLE_SECONDS (aiohttp starts this timer when a connection opens).
RUNNER_OPTIONS: dict[str, Any] = {"keepalive_timeout": IDLE_SECONDS}


def create_app(state: AdminState) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[guard])
    app["state"] = state
    app.router.add_get("/healthcheck", healthcheck)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/rlconfig", rlconfig)
    if not state.service.settings.admin_read_only:  # read-only: probes and scrapes alone
        app.router.add_route("*", "/json", json_decide)
        add_counter_routes(app)
        add_usage_routes(app)
        add_switch_routes(app)
        add_freq_routes(app, getattr(state, "counters", None))
        add_top_routes(app)
    publish(state.service.settings, state.metrics)
    return app


async def healthcheck(request: web.Request) -> web.Response:
    state: AdminState = request.app["state"]
    if state.draining:
        return web.Response(status=503, text="draining\n")
    config = state.config()
    if config is None:
        return web.Response(status=500, text="")
    if state.require_domain and not config.domains:
        return web.Response(status=500, text="no domain loaded\n")
    if not state.store_ready:
        return web.Response(status=500, text="store not ready\n")
    problem = state.worker_problem()  # --workers: a sibling worker down or crash-looping
    if problem is not None:
        return web.Response(status=503, text=problem + "\n")
    return web.Response(text="OK")


async def metrics(request: web.Request) -> web.Response:
    state: AdminState = request.app["state"]
    body = state.metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def rlconfig(request: web.Request) -> web.Response:
    """One line per limit in the reference's format; `?format=json` adds switches and files."""
    state: AdminState = request.app["state"]
    config = state.config()
    if config is None:
        return web.Response(status=503, text="no rate limit configuration loaded\n")
    if request.query.get("format") == "json":
        return web.json_response(
            {
                "files": config.files,
                "domains": sorted(config.domains),
                "key_hash": {
                    name: dom.key_hash
                    for name, dom in sorted(config.domains.items())
                    if dom.key_hash
                },
                "limits": [_limit_json(limit) for limit in config.all_limits()],
                "switches": switch_state(state.service.settings),
                "source": state.config_source() if state.config_source is not None
                else {"type": "FILE"},
            }
        )
    lines = []
    for limit in config.all_limits():
        if limit.unlimited:
            line = f"{limit.full_key}: unlimited"
        else:
            line = (
                f"{limit.full_key}: unit={limit.unit.name} "
                f"requests_per_unit={limit.requests_per_unit}"
            )
        line += f", shadow_mode: {str(limit.shadow_mode).lower()}"
        line += f", quota_mode: {str(limit.quota_mode).lower()}"
        if limit.algorithm != "fixed_window":
            line += f", algorithm: {limit.algorithm}"
        if limit.unit_multiplier != 1:
            line += f", unit_multiplier: {limit.unit_multiplier}"
        if limit.rolling:
            line += f", window: {WINDOW_ROLLING}"
        if limit.name:
            line += f", name: {limit.name}"
        lines.append(line)
        lines.extend(  # not enforced: counted beside the limit (docs/changing-limits.md)
            f"{limit.full_key} ~ candidate {c.candidate}: unit={c.unit.name} "
            f"requests_per_unit={c.requests_per_unit}"
            + (f", algorithm: {c.algorithm}" if c.algorithm != "fixed_window" else "")
            + (f", unit_multiplier: {c.unit_multiplier}" if c.unit_multiplier != 1 else "")
            for c in limit.candidates
        )
    return web.Response(text="\n".join(lines) + ("\n" if lines else ""))


def _limit_json(limit: Limit) -> dict[str, object]:
    out = _limit_fields(limit)
    if limit.candidates:
        out["candidates"] = [
            {"candidate": c.candidate, **_limit_fields(c)} for c in limit.candidates
        ]
    return out


def _limit_fields(limit: Limit) -> dict[str, object]:
    return {
        "key": limit.full_key,
        "name": limit.name,
        "unlimited": limit.unlimited,
        "requests_per_unit": limit.requests_per_unit,
        "unit": limit.unit.name,
        "unit_multiplier": limit.unit_multiplier,
        "algorithm": limit.algorithm,
        "burst": limit.burst,
        "overdraft": limit.overdraft,
        "calendar": limit.calendar,
        "window": WINDOW_ROLLING if limit.rolling else WINDOW_ALIGNED,
        "timezone": limit.timezone,
        "charge": limit.charge,
        "accept_releases": limit.accept_releases,
        "shadow_mode": limit.shadow_mode,
        "quota_mode": limit.quota_mode,
        "replaces": sorted(limit.replaces),
    }


async def json_decide(request: web.Request) -> web.Response:
    """ShouldRateLimit with a proto3-JSON RateLimitRequest body (envoyproxy/ratelimit /json)."""
    state: AdminState = request.app["state"]
    loaded = state.config()
    if loaded is None or not loaded.domains:  # errors are JSON {"error": …} like the admin API
        return web.json_response({"error": "no config loaded"}, status=503)
    try:
        body = await read_json(request)
        req = json_format.ParseDict(body, rls_pb2.RateLimitRequest())
    except BadBody as exc:
        return exc.response
    except (json_format.ParseError, ValueError, TypeError, AttributeError) as exc:
        return web.json_response({"error": f"Bad Request: {exc}"}, status=400)
    try:
        resp = await state.service.decide(req)
    except (InvalidRequest, RuntimeError) as exc:
        return web.json_response({"error": f"Bad Request: {exc}"}, status=400)
    payload = json_format.MessageToDict(resp)
    status = 429 if resp.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT else 200
    if resp.overall_code == rls_pb2.RateLimitResponse.UNKNOWN:
        status = 500
    return web.Response(
        status=status, text=json.dumps(payload), content_type="application/json"
    )
