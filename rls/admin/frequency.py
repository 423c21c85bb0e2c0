"""Frequency counters on admin HTTP (same operations as gRPC rls.counters.v1.Counters).

POST /v1/counters/add        one item            → {"code","freq","ttl"}      (token)
POST /v1/counters/get        one item            → {"code","freq","ttl","stale"?}
POST /v1/counters/batch_add  {"items": [≤ 30]}   → {"code","message","results"} (token)
POST /v1/counters/batch_get  {"items": [≤ 30]}   → {"code","message","results"}
GET  /v1/counters/list?domain=d                  → live counters (≤ 1000) with their original keys
Bodies must be `content-type: application/json` and obey the admin API's body rules (size,
read time, nesting: auth.read_json), like every other admin route. An item: {"domain" (or
"appid"), "key", "time_span", "time_unit": second|minute|hour|day|week|month, "hits",
"timezone", "window": calendar|rolling_from_first_hit}. Statuses: 400 invalid (batch: nothing
charged), 401 token, 408 body too slow, 413 body too large, 415 not JSON, 503 an Add the store
failed (see message) or a Get with nothing known.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from rls.admin.auth import BadBody, Handler, counters_error, read_json, requires_token
from rls.frequency.model import MAX_BATCH, InvalidItem, Item, Result, item_from_json
from rls.frequency.service import CountersService
from rls.frequency.storage import CounterStoreError

SERVICE_KEY = web.AppKey("counters_service", CountersService)


class _Refused(Exception):
    """An answer other than 200, in the counters API's shape {"code", "message", …}."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.response = web.json_response(counters_error(status, message, **extra), status=status)


def _answers(handler: Handler) -> Handler:
    """Turn a _Refused raised by the handler into its response."""

    async def answering(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except _Refused as exc:
            return exc.response

    answering.__name__ = handler.__name__
    return answering


async def _body(request: web.Request) -> Any:
    """The JSON body under the admin API's one set of body rules (auth.read_json: size 413,
    read time 408, nesting and syntax 400); the content type was checked by auth.guard."""
    try:
        return await read_json(request)
    except BadBody as exc:
        raise _Refused(exc.status, exc.message) from None


def _service(request: web.Request) -> CountersService:
    service = request.app.get(SERVICE_KEY)
    if service is None:
        raise _Refused(404, "counters service not running here")
    return service


async def _items(request: web.Request, batch: bool) -> list[Item]:
    service = _service(request)
    body = await _body(request)
    if not batch:
        try:
            return [item_from_json(service.config, body)]
        except InvalidItem as exc:
            raise _Refused(400, str(exc)) from None
    raw = body.get("items") if isinstance(body, dict) else None
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_BATCH:
        raise _Refused(400, f'body must be {{"items": [1..{MAX_BATCH} items]}}')
    items, errors = [], []
    for index, entry in enumerate(raw):
        try:
            items.append(item_from_json(service.config, entry))
        except InvalidItem as exc:
            errors.append({"index": index, "message": str(exc)})
    if errors:
        raise _Refused(400, "invalid batch: nothing was charged", errors=errors)
    return items


def _batch(results: list[Result]) -> web.Response:
    failed = sum(1 for r in results if r.code != "ok")
    body: dict[str, Any] = {"code": "ok" if not failed else "unavailable", "message": ""}
    if failed:
        body["message"] = f"{failed} of {len(results)} items failed (see their codes)"
    body["results"] = [r.to_json() for r in results]
    return web.json_response(body)


@requires_token
async def add(request: web.Request) -> web.Response:
    items = await _items(request, batch=False)
    try:
        (res,) = await _service(request).add(items)
    except CounterStoreError as exc:
        raise _Refused(503, f"add failed: {exc}") from None
    if res.code != "ok":
        raise _Refused(503, f"not charged: {res.message}")
    return web.json_response(res.to_json())


async def get(request: web.Request) -> web.Response:
    items = await _items(request, batch=False)
    (res,) = await _service(request).get(items)
    if res.code != "ok" and not res.stale:
        raise _Refused(503, res.message)
    return web.json_response(res.to_json())


@requires_token
async def batch_add(request: web.Request) -> web.Response:
    items = await _items(request, batch=True)
    try:
        results = await _service(request).add(items)
    except CounterStoreError as exc:
        raise _Refused(503, f"batch add failed: {exc}") from None
    return _batch(results)


async def batch_get(request: web.Request) -> web.Response:
    items = await _items(request, batch=True)
    return _batch(await _service(request).get(items))


async def listing(request: web.Request) -> web.Response:
    domain = request.query.get("domain", "")
    if not domain:
        raise _Refused(400, "?domain= is required")
    try:
        found = await _service(request).listing(domain)
    except CounterStoreError as exc:
        raise _Refused(503, str(exc)) from None
    return web.json_response({"domain": domain, **found})


def add_freq_routes(app: web.Application, service: CountersService | None = None) -> None:
    """Register the routes; without a service they answer 404."""
    if service is not None:
        app[SERVICE_KEY] = service
    for path, handler in (
        ("/v1/counters/add", add),
        ("/v1/counters/get", get),
        ("/v1/counters/batch_add", batch_add),
        ("/v1/counters/batch_get", batch_get),
    ):
        app.router.add_post(path, _answers(handler))
    app.router.add_get("/v1/counters/list", _answers(listing))
