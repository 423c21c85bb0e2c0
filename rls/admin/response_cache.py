"""Admin HTTP routes of the response cache: `POST /cache/purge?api=NAME`, `GET /cache/stats`.

Purge is mutating, so it requires `Authorization: Bearer $RLS_ADMIN_TOKEN` whenever that
variable is set (read per request, so a rotated token needs no restart); stats are read-only.
An unknown API is a 404 that lists the APIs the rules define. Without a response cache
(`rls serve` with no `--cache-config`) both routes answer 404 saying so, rather than aiohttp's
bare `Not Found`.
"""

from __future__ import annotations

from aiohttp import web

from rls.admin.auth import requires_token
from rls.response_cache.cache import ResponseCache
from rls.response_cache.store import StoreError

CACHE_KEY = web.AppKey("rls_cache", ResponseCache)
NO_CACHE = "no response cache here: rls serve runs without --cache-config"


def add_cache_routes(app: web.Application, cache: ResponseCache | None) -> None:
    if cache is not None:
        app[CACHE_KEY] = cache
    app.router.add_post("/cache/purge", purge)
    app.router.add_get("/cache/stats", stats)


@requires_token
async def purge(request: web.Request) -> web.Response:
    cache = request.app.get(CACHE_KEY)
    if cache is None:
        return web.json_response({"error": NO_CACHE}, status=404)
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
    cache = request.app.get(CACHE_KEY)
    if cache is None:
        return web.json_response({"error": NO_CACHE}, status=404)
    return web.json_response(cache.stats())
