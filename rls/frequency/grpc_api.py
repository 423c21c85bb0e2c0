"""`rls.counters.v1.Counters` on the RateLimitService port (generic handlers, like the rest).

Status codes: a malformed request or batch → INVALID_ARGUMENT (a batch: nothing charged);
Add whose store call failed → UNAVAILABLE (never a silent success); per-item failures inside
a batch → OK with the item's code UNAVAILABLE and the batch code UNAVAILABLE ("some failed").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from rls.frequency.model import MAX_BATCH, InvalidItem, Item, Result, make_item
from rls.frequency.proto import counters_pb2
from rls.frequency.service import CountersService
from rls.frequency.storage import CounterStoreError
from rls.services import decoding

pb: Any = counters_pb2  # generated module: no type information

SERVICE_NAME = "rls.counters.v1.Counters"

_UNITS = {
    pb.SECOND: "second", pb.MINUTE: "minute", pb.HOUR: "hour", pb.DAY: "day",
    pb.WEEK: "week", pb.MONTH: "month",
}
_WINDOWS = {pb.CALENDAR: "calendar", pb.ROLLING_FROM_FIRST_HIT: "rolling_from_first_hit"}
_CODES = {"ok": pb.OK, "invalid": pb.INVALID, "unavailable": pb.UNAVAILABLE}


def _item(service: CountersService, req: pb.CounterRequest) -> Item:
    unit = _UNITS.get(req.time_unit)
    if unit is None:
        raise InvalidItem("time_unit must be set (SECOND … MONTH)")
    window = _WINDOWS.get(req.window)
    if window is None:
        raise InvalidItem("unknown window")
    return make_item(
        service.config, req.domain, req.key, req.time_span or 1, unit, int(req.hits),
        req.timezone, window,
    )


def _result(res: Result) -> pb.CounterResult:
    return pb.CounterResult(
        code=_CODES[res.code], message=res.message, freq=res.freq, ttl=res.ttl, stale=res.stale
    )


class CountersGrpc:
    def __init__(self, service: CountersService) -> None:
        self.service = service

    async def _items(
        self, reqs: Sequence[pb.CounterRequest], context: grpc.aio.ServicerContext
    ) -> list[Item]:
        if not 1 <= len(reqs) <= MAX_BATCH:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"a batch holds 1..{MAX_BATCH} items"
            )
        items, errors = [], []
        for index, req in enumerate(reqs):
            try:
                items.append(_item(self.service, req))
            except InvalidItem as exc:
                errors.append(f"item {index}: {exc}")
        if errors:
            prefix = "invalid batch, nothing charged: " if len(reqs) > 1 else ""
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, prefix + "; ".join(errors))
        return items

    async def add(
        self, req: pb.CounterRequest, context: grpc.aio.ServicerContext
    ) -> pb.CounterResult:
        items = await self._items([req], context)
        try:
            (res,) = await self.service.add(items)
        except CounterStoreError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"add failed: {exc}")
        if res.code != "ok":
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"not charged: {res.message}")
        return _result(res)

    async def get(
        self, req: pb.CounterRequest, context: grpc.aio.ServicerContext
    ) -> pb.CounterResult:
        items = await self._items([req], context)
        (res,) = await self.service.get(items)
        if res.code != "ok" and not res.stale:
            await context.abort(grpc.StatusCode.UNAVAILABLE, res.message)
        return _result(res)

    async def batch_add(
        self, req: pb.BatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.BatchResponse:
        items = await self._items(req.items, context)
        try:
            results = await self.service.add(items)
        except CounterStoreError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"batch add failed: {exc}")
        return batch_response(results)

    async def batch_get(
        self, req: pb.BatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.BatchResponse:
        items = await self._items(req.items, context)
        return batch_response(await self.service.get(items))

    def handler(self) -> grpc.GenericRpcHandler:
        # Decoded by the handler: undecodable bytes are INVALID_ARGUMENT (rls/services/decoding.py)
        unary = decoding.unary_unary
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "Add": unary(self.add, pb.CounterRequest, pb.CounterResult),
                "Get": unary(self.get, pb.CounterRequest, pb.CounterResult),
                "BatchAdd": unary(self.batch_add, pb.BatchRequest, pb.BatchResponse),
                "BatchGet": unary(self.batch_get, pb.BatchRequest, pb.BatchResponse),
            },
        )


def batch_response(results: Sequence[Result]) -> pb.BatchResponse:
    failed = sum(1 for r in results if r.code != "ok")
    resp = pb.BatchResponse(results=[_result(r) for r in results])
    if failed:
        resp.code = pb.UNAVAILABLE
        resp.message = f"{failed} of {len(results)} items failed (see their codes)"
    return resp
