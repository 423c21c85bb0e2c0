"""Admin HTTP routes of the response cache: `POST /cache/purge?api=NAME`, `GET /cache/stats`.

Purge is mutating, so it requires `Authorization: Bearer $RLS_ADMIN_TOKEN` whenever that
variable is set (read per request, so a rotated token needs no restart); stats are read-only.
"""

from __future__ import annotations

import hmac
import os

from aiohttp import web

from rls.cache.cache import ResponseCache
from rls.cache.store import StoreError

CACHE_KEY = web.AppKey("rls_cache", ResponseCache)
TOKEN_ENV = "RLS_ADMIN_TOKEN"


def add_cache_routes(app: web.Application, cache: ResponseCache) -> None:
    app[CACHE_KEY] = cache
    app.router.add_post("/cache/purge", purge)
    app.router.add_get("/cache/stats", stats)


def authorized(request: web.Request) -> bool:
    token = os.environ.get(TOKEN_ENV)
    if not token:
        return True
    given = request.headers.get("Authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


async def purge(request: web.Request) -> web.Response:
    if not authorized(request):
        return web.json_response(
            {"error": "missing or wrong bearer token"},
            status=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
    cache = request.app[CACHE_KEY]
    api = request.query.get("api", "")
    if not api:
        return web.json_response({"error": "query parameter 'api' is required"}, status=400)
    try:
        version = await cache.purge(api)
    except KeyError:
        known = sorted(cache.config.apis)
        return web.json_response({"error": f"unknown api {api!r}", "apis": known}, status=404)
    except StoreError as exc:
        return web.json_response({"error": str(exc)}, status=503)
    return web.json_response({"api": api, "purged": True, "version": version})


async def stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[CACHE_KEY].stats())
