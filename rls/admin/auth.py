"""What the admin listener lets in (docs/admin.md, "Access").

- A bearer token (`RLS_ADMIN_TOKEN`) guards every request that charges or changes state:
  every method but GET/HEAD/OPTIONS (except the read-only queries `POST /counters`,
  `/v1/counters/get`, `/v1/counters/batch_get`) and `/json`
  whatever the method (it charges counters, like Envoy's calls). `/healthcheck`, `/metrics`
  and the other reads stay open for probes and Prometheus.
- Every POST (any method but GET/HEAD/OPTIONS) must say `Content-Type: application/json`
  (415 otherwise): a cross-site HTML form
  or `text/plain` fetch cannot reach a mutation without a CORS preflight, which we never grant.
- Bodies are read with a size limit (413), a time limit (408) and parsed with a nesting limit
  (400), each answered with a JSON error instead of a traceback or a 500.
- With no token, the listener must be on loopback (Settings.validate refuses to start
  otherwise unless `--admin-insecure`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from rls.settings.environment import admin_token

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

MAX_BODY_BYTES = 1 << 20  # aiohttp's client_max_size for the admin app
MAX_JSON_DEPTH = 32  # real bodies nest 5 levels (items → descriptors → entries)
BODY_SECONDS = 10.0  # a client must send its whole body within this
IDLE_SECONDS = 15.0  # idle or slow-header connections are closed after this (keep-alive)
READ_ONLY_POSTS = frozenset(
    {"/counters", "/v1/counters/get", "/v1/counters/batch_get"}  # queries, no charge
)
ALWAYS_GUARDED = frozenset({"/json"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def json_error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers or None)


# The frequency-counters API answers every refusal as {"code", "message"}, like its gRPC twin
# (docs/counters.md), the ones of this module (401, 413, 415) included.
COUNTERS_PREFIX = "/v1/counters/"


def counters_error(status: int, message: str, **extra: Any) -> dict[str, Any]:
    """A refusal of the counters API: `invalid` for the caller's mistakes, `unavailable`."""
    return {"code": "invalid" if status < 500 else "unavailable", "message": message, **extra}


def refusal(request: web.Request, status: int, message: str, **headers: str) -> web.Response:
    """A refusal in the shape of the API the request was for."""
    if request.path.startswith(COUNTERS_PREFIX):
        return web.json_response(
            counters_error(status, message), status=status, headers=headers or None
        )
    return json_error(status, message, **headers)


def _token_ok(request: web.Request, token: str) -> bool:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode("utf-8", "surrogateescape"), token.encode()
    )


def _unauthorized(request: web.Request) -> web.Response:
    return refusal(
        request, 401, "missing or wrong bearer token", **{"WWW-Authenticate": "Bearer"}
    )


def requires_token(handler: Handler) -> Handler:
    """Per-handler guard (also applied by `guard` for the whole admin app)."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        token = admin_token()
        if token is not None and not _token_ok(request, token):
            return _unauthorized(request)
        return await handler(request)

    guarded.__name__ = handler.__name__
    return guarded


def needs_token(request: web.Request) -> bool:
    if request.path in ALWAYS_GUARDED:
        return True
    return request.method not in SAFE_METHODS and request.path not in READ_ONLY_POSTS


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Token, content type and body errors for every admin route (see the module doc)."""
    token = admin_token()
    if token is not None and needs_token(request) and not _token_ok(request, token):
        return _unauthorized(request)
    if request.method not in SAFE_METHODS and request.content_type != "application/json":
        return refusal(
            request, 415,
            f"{request.method} requests must be sent as Content-Type: application/json",
        )
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:
        return refusal(request, 413, f"body larger than {MAX_BODY_BYTES} bytes")


class BadBody(Exception):
    """A request body that is not acceptable JSON: `status` and `message` say why, `response`
    is the admin API's JSON error for it (routes with their own error shape use the first two).
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    @property
    def response(self) -> web.Response:
        return json_error(self.status, self.message)


async def read_json(request: web.Request) -> Any:
    """The request's JSON body within the size, time and depth limits; raises BadBody."""
    try:
        raw = await asyncio.wait_for(request.read(), BODY_SECONDS)
    except TimeoutError:
        raise BadBody(408, f"body not received within {BODY_SECONDS:g} s") from None
    except web.HTTPRequestEntityTooLarge:
        raise BadBody(413, f"body larger than {MAX_BODY_BYTES} bytes") from None
    if not raw.strip():
        raise BadBody(400, "body must be JSON (it is empty)")
    try:
        body = json.loads(raw)
    except RecursionError:
        raise BadBody(400, f"JSON nested deeper than {MAX_JSON_DEPTH}") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise BadBody(400, f"body must be JSON: {exc}") from None
    if _depth(body) > MAX_JSON_DEPTH:
        raise BadBody(400, f"JSON nested deeper than {MAX_JSON_DEPTH}")
    return body


def _depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value, without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            if depth > MAX_JSON_DEPTH:
                return depth
            stack.extend((child, depth + 1) for child in item)
    return deepest
