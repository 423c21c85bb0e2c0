"""gRPC `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` on grpc.aio.

The handler takes and returns raw bytes so that an undecodable request (bad wire format,
invalid UTF-8 in a string field) becomes INVALID_ARGUMENT instead of grpc's generic error.
"""

from __future__ import annotations

import logging
import time

import grpc
from envoy.service.ratelimit.v3 import rls_pb2
from google.protobuf.message import DecodeError

from rls.engine.limiter import (
    DescriptorIn,
    InvalidRequest,
    NoConfigLoaded,
    Overloaded,
    RateLimiter,
    StoreFailed,
)
from rls.memo import PARSE_MEMO_BYTES, PARSE_MEMO_ENTRIES, BoundedCache, entries_cost
from rls.observability.logs import LogGate
from rls.observability.metrics import Metrics
from rls.services.convert import ResponseShapes, to_descriptors, to_response
from rls.services.extras import decorate
from rls.settings import Settings

log = logging.getLogger("rls.service")

SERVICE_NAME = "envoy.service.ratelimit.v3.RateLimitService"
# Estimated memory of a decoded RateLimitRequest kept in the parse memo (upb messages).
DECODED_BYTES_PER_WIRE_BYTE = 3
DECODED_OVERHEAD = 512
# Why a call was answered UNAVAILABLE (rls_errors_total's reason).
_UNAVAILABLE_REASON: dict[type[Exception], str] = {
    Overloaded: "overloaded", NoConfigLoaded: "unavailable", StoreFailed: "store_failed",
}

# (domain, descriptors, request hits_addend, the decoded request when at hand)
Parsed = tuple[str, list[DescriptorIn], int, rls_pb2.RateLimitRequest | None]


class RateLimitService:
    def __init__(self, limiter: RateLimiter, settings: Settings, metrics: Metrics) -> None:
        self.limiter = limiter
        self.settings = settings
        self.metrics = metrics
        self._log_gate = LogGate(per_second=5)
        self._parsed = BoundedCache("request_parse", PARSE_MEMO_ENTRIES, PARSE_MEMO_BYTES)
        self._shapes = ResponseShapes()
        self._inflight = 0
        self._margin = settings.deadline_margin_ms / 1000

    @property
    def _extras(self) -> bool:
        s = self.settings
        return s.response_headers or s.json_body or s.dynamic_metadata

    to_response = staticmethod(to_response)

    async def decide(
        self, request: rls_pb2.RateLimitRequest, raw: bytes | None = None
    ) -> rls_pb2.RateLimitResponse:
        """Validate and decide one parsed request (shared by gRPC and the admin /json)."""
        descriptors = to_descriptors(request, self.settings, raw)
        decision = await self.limiter.should_rate_limit(
            request.domain, descriptors, request.hits_addend
        )
        response = to_response(decision)
        if self._extras:
            decorate(response, decision, request, self.settings)
        return response

    async def should_rate_limit(self, data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        started = time.perf_counter()
        parsed = self._parsed.get(data)
        repeat = parsed is not None
        if parsed is None:
            parsed = await self._parse(data, context)
        domain, descriptors, request_hits, request = parsed
        # The caller's deadline (Envoy sends its filter timeout as grpc-timeout, with the same
        # value in x-envoy-expected-rq-timeout-ms) sets the budget, less a margin to send the
        # answer back; without one, --backend-timeout-ms applies (no metadata scan per call).
        remaining = context.time_remaining()
        # The margin grows with the deadline (10 %): answering takes longer under load.
        budget = (
            None if remaining is None
            else max(remaining - max(self._margin, remaining / 10), 0.001)
        )
        if self._inflight >= self.settings.max_inflight:
            self.metrics.count_failure_answer(domain, "overloaded", "resource_exhausted")
            self.metrics.errors.labels("overloaded").inc()
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"rls overloaded: {self._inflight} decisions in flight",
            )
        self._inflight += 1
        try:
            decision = await self.limiter.should_rate_limit(
                domain, descriptors, request_hits, budget_s=budget, repeat=repeat
            )
        except InvalidRequest as exc:
            await self._reject(context, str(exc))
        except (Overloaded, NoConfigLoaded, StoreFailed) as exc:
            self.metrics.errors.labels(_UNAVAILABLE_REASON[type(exc)]).inc()
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        finally:
            self._inflight -= 1
        if self._extras:
            response = to_response(decision)
            if request is None:
                request = rls_pb2.RateLimitRequest.FromString(data)
            decorate(response, decision, request, self.settings)
            answer: bytes = response.SerializeToString()
        else:
            answer = self._shapes.serialize(decision)
        self.metrics.latency.observe(time.perf_counter() - started)
        return answer

    async def _parse(self, data: bytes, context: grpc.aio.ServicerContext) -> Parsed:
        """Decode and validate; valid results are memoised by their bytes.

        Envoy sends byte-identical requests for the same caller, path and address again and
        again, so most calls skip protobuf decoding and validation (half of rls's own cost per
        call). Invalid requests are never memoised; the memo is bounded in entries and bytes
        (rls.memo.BoundedCache, least recently used out first).
        """
        if len(data) > self.settings.max_request_bytes:
            await self._reject(context, f"request of {len(data)} bytes is too large")
        try:
            request = rls_pb2.RateLimitRequest.FromString(data)
        except DecodeError as exc:
            await self._reject(context, f"malformed RateLimitRequest: {exc}")
        try:
            descriptors = to_descriptors(request, self.settings, data)
        except InvalidRequest as exc:
            await self._reject(context, str(exc))
        parsed: Parsed = (request.domain, descriptors, request.hits_addend, request)
        cost = len(data) + 2 * len(request.domain) + sum(
            entries_cost(d.entries) + 96 for d in descriptors
        )
        # With a response extra on, the decoded request is kept too: the extras read it, and
        # decoding it again on every hit would undo the memo.
        kept = request if self._extras else None
        if kept is not None:
            cost += DECODED_BYTES_PER_WIRE_BYTE * len(data) + DECODED_OVERHEAD
        self._parsed.put(data, (request.domain, descriptors, request.hits_addend, kept), cost)
        return parsed

    async def _reject(self, context: grpc.aio.ServicerContext, message: str) -> None:
        self.metrics.errors.labels("invalid_argument").inc()
        if self._log_gate.allow():
            request_id = dict(context.invocation_metadata() or ()).get("x-request-id", "-")
            suppressed = self._log_gate.take_suppressed()
            log.info(
                "invalid request (request_id=%s, peer=%s%s): %s",
                request_id,
                context.peer(),
                f", {suppressed} more not logged" if suppressed else "",
                message,
            )
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {"ShouldRateLimit": grpc.unary_unary_rpc_method_handler(self.should_rate_limit)},
        )
