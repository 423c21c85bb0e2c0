"""Runtime switches: global shadow, limiting off (degradation), per-domain shadow.

GET /switches -> current state; POST /switches {"shadow_mode": true, "limiting_off": false,
"shadow_domains": ["d"]} changes the given fields (bearer token when RLS_ADMIN_TOKEN is set).
They start from the flags/env (RLS_SHADOW_MODE, RLS_LIMITING_OFF) and are shown in /rlconfig
and as the gauge rls_switch{name}.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any

from aiohttp import web

from rls.admin.auth import BadBody, read_json, requires_token
from rls.settings import Settings
from rls.settings.environment import shared_dir

log = logging.getLogger("rls.admin")


def switch_state(settings: Settings) -> dict[str, Any]:
    return {
        "shadow_mode": settings.shadow_mode,
        "limiting_off": settings.limiting_off,
        "shadow_domains": sorted(settings.shadow_domains),
    }


def publish(settings: Settings, metrics: Any) -> None:
    metrics.switch.labels("shadow_mode").set(float(settings.shadow_mode))
    metrics.switch.labels("limiting_off").set(float(settings.limiting_off))
    metrics.switch.labels("shadow_domains").set(float(len(settings.shadow_domains)))


async def get_switches(request: web.Request) -> web.Response:
    return web.json_response(switch_state(request.app["state"].service.settings))


@requires_token
async def set_switches(request: web.Request) -> web.Response:
    state = request.app["state"]
    settings: Settings = state.service.settings
    try:
        body = await read_json(request)
    except BadBody as exc:
        return exc.response
    if not isinstance(body, dict) or set(body) - {"shadow_mode", "limiting_off", "shadow_domains"}:
        return web.json_response(
            {"error": "fields: shadow_mode, limiting_off (booleans), shadow_domains (list)"},
            status=400,
        )
    for name in ("shadow_mode", "limiting_off"):
        if name in body and not isinstance(body[name], bool):
            return web.json_response({"error": f"{name} must be a boolean"}, status=400)
    domains = body.get("shadow_domains")
    if domains is not None and (
        not isinstance(domains, list) or not all(isinstance(d, str) for d in domains)
    ):
        return web.json_response({"error": "shadow_domains must be a list"}, status=400)
    if "shadow_mode" in body:
        settings.shadow_mode = body["shadow_mode"]
    if "limiting_off" in body:
        settings.limiting_off = body["limiting_off"]
    if domains is not None:
        settings.shadow_domains = set(domains)
    save_shared(settings)
    publish(settings, state.metrics)
    log.warning("runtime switches changed: %s", switch_state(settings))
    return web.json_response(switch_state(settings))


def _shared_file() -> str | None:
    folder = shared_dir()
    return None if folder is None else os.path.join(folder, "switches.json")


def save_shared(settings: Settings) -> None:
    """With several workers, publish the switches for the others (atomic replace)."""
    path = _shared_file()
    if path is None:
        return
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(switch_state(settings), fh)
    os.replace(tmp, path)


async def follow_shared(settings: Settings, metrics: Any, interval: float = 0.5) -> None:
    """Apply switches another worker changed (polls the shared file's mtime)."""
    path = _shared_file()
    if path is None:
        return
    seen = 0
    while True:
        await asyncio.sleep(interval)
        try:
            mtime = os.stat(path).st_mtime_ns
            if mtime == seen:
                continue
            with open(path, encoding="utf-8") as fh:
                state = json.load(fh)
        except (OSError, ValueError):
            continue
        seen = mtime
        settings.shadow_mode = bool(state.get("shadow_mode"))
        settings.limiting_off = bool(state.get("limiting_off"))
        settings.shadow_domains = set(state.get("shadow_domains") or ())
        publish(settings, metrics)


def add_switch_routes(app: web.Application) -> None:
    app.router.add_get("/switches", get_switches)
    app.router.add_post("/switches", set_switches)
