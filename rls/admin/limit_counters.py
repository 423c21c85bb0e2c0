"""Counter query (no charge) and add/charge for callers that are not behind Envoy.

POST /counters  {"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}
POST /add       {"items": [{"domain": "d", "descriptors": [...], "hitsAddend": 2}, ...]}
Both take at most MAX_BATCH descriptors / items. /add validates the whole batch first: one bad
item rejects the batch (400, errors by index) and nothing is charged.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from envoy.service.ratelimit.v3 import rls_pb2
from google.protobuf import json_format

from rls.admin.auth import BadBody, read_json, requires_token
from rls.engine.limiter import DescriptorIn, InvalidRequest
from rls.services.convert import to_descriptors
from rls.stores.base import BackendError

MAX_BATCH = 30


async def _json_body(request: web.Request) -> Any:
    try:
        return await read_json(request)
    except BadBody as exc:
        return exc.response


def _bad(message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=400)


def _parse_request(item: Any, state: Any) -> tuple[rls_pb2.RateLimitRequest, list[DescriptorIn]]:
    if not isinstance(item, dict):
        raise InvalidRequest("each item must be a JSON object")
    try:
        req = json_format.ParseDict(item, rls_pb2.RateLimitRequest())
    except (json_format.ParseError, ValueError, TypeError) as exc:
        raise InvalidRequest(str(exc)) from None
    return req, to_descriptors(req, state.service.settings)


async def counters(request: web.Request) -> web.Response:
    state = request.app["state"]
    body = await _json_body(request)
    if isinstance(body, web.Response):
        return body
    if not isinstance(body, dict):
        return _bad("body must be a JSON object")
    descriptors = body.get("descriptors")
    if isinstance(descriptors, list) and len(descriptors) > MAX_BATCH:
        return _bad(f"at most {MAX_BATCH} descriptors per query")
    try:
        req, parsed = _parse_request(body, state)
        results = await state.service.limiter.query(req.domain, parsed)
    except InvalidRequest as exc:
        return _bad(str(exc))
    except (RuntimeError, TimeoutError, BackendError) as exc:
        return web.json_response({"error": str(exc) or "backend timeout"}, status=503)
    out = []
    for desc, limits in zip(parsed, results, strict=True):
        out.append(
            {
                "entries": [{"key": k, "value": v} for k, v in desc.entries],
                "limits": [
                    {
                        "key": limit.full_key,
                        "name": limit.name,
                        "algorithm": limit.algorithm,
                        "requests_per_unit": limit.requests_per_unit,
                        "unit": limit.unit.name,
                        "unit_multiplier": limit.unit_multiplier,
                        "used": outcome.used,
                        "remaining": outcome.remaining if outcome.ok else 0,
                        "over_limit": not outcome.ok,
                        "reset_seconds": -(-outcome.reset_ms // 1000),
                    }
                    for limit, outcome in limits
                ],
            }
        )
    return web.json_response({"domain": req.domain, "results": out})


@requires_token
async def add(request: web.Request) -> web.Response:
    state = request.app["state"]
    body = await _json_body(request)
    if isinstance(body, web.Response):
        return body
    items = body.get("items") if isinstance(body, dict) else None
    if not isinstance(items, list) or not items:
        return _bad('body must be {"items": [RateLimitRequest JSON, ...]}')
    if len(items) > MAX_BATCH:
        return _bad(f"at most {MAX_BATCH} items per batch")
    parsed = []
    errors = []
    for index, item in enumerate(items):
        try:
            parsed.append(_parse_request(item, state))
        except InvalidRequest as exc:
            errors.append({"index": index, "error": str(exc)})
    if errors:
        return _bad("invalid batch: nothing was charged", errors=errors)
    results: list[dict[str, Any]] = []
    for req, descriptors in parsed:
        try:
            decision = await state.service.limiter.should_rate_limit(
                req.domain, descriptors, req.hits_addend
            )
        except (RuntimeError, InvalidRequest) as exc:
            results.append({"error": str(exc)})
            continue
        response = state.service.to_response(decision)
        results.append(json_format.MessageToDict(response))
    return web.json_response({"results": results})


def add_counter_routes(app: web.Application) -> None:
    app.router.add_post("/counters", counters)
    app.router.add_post("/add", add)
