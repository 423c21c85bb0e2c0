"""Bearer-token guard for mutating admin endpoints (`RLS_ADMIN_TOKEN`; none set = open)."""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def admin_token() -> str | None:
    return os.environ.get("RLS_ADMIN_TOKEN") or None


def requires_token(handler: Handler) -> Handler:
    async def guarded(request: web.Request) -> web.StreamResponse:
        token = admin_token()
        if token is not None:
            header = request.headers.get("Authorization", "")
            scheme, _, given = header.partition(" ")
            expected = token.encode()
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode("utf-8", "surrogateescape"), expected
            ):
                return web.json_response(
                    {"error": "missing or wrong bearer token"},
                    status=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
        return await handler(request)

    guarded.__name__ = handler.__name__
    return guarded
