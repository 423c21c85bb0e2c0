"""The spans: one server span per ShouldRateLimit call, per RLQS usage report and per ext_proc
stream, each joined to the caller's trace, and a child span for a decision's store call.

Nothing here runs with tracing off: `rls.tracing.wiring.Tracing` wraps the gRPC handlers and
the limiter's store call once, at start, and only when tracing is on, so the plain handlers
carry no tracing object and test no flag per call. With tracing on, a call the sampler drops
costs the context extraction and a non-recording span (never made current); attributes
(which decode the request and the answer a second time) are computed only for recorded spans.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
from envoy.service.rate_limit_quota.v3 import rlqs_pb2
from envoy.service.ratelimit.v3 import rls_pb2
from google.protobuf.message import DecodeError
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import DefaultGetter, TextMapPropagator
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from rls.core.model import Check, Outcome
from rls.core.usage import UsageOp
from rls.engine.limiter import StoreCall

# Span attributes an operator filters on (docs/observability.md#tracing).
DOMAIN = "rls.domain"
DESCRIPTORS = "rls.descriptors"
CODE = "rls.code"  # the overall answer: OK or OVER_LIMIT
LIMIT = "rls.limit"  # the limit that decided: its name, else "<requests>/<unit>"
STORE = "rls.store"  # memory or redis
FAILURE = "rls.failure_reason"  # store_down, store_slow, store_error: the failure mode answered
CHECKS = "rls.checks"
BUCKETS = "rls.buckets"

UnaryBehavior = Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]
StreamBehavior = Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]]


_GETTER = DefaultGetter()
_CODES = {rls_pb2.RateLimitResponse.OK: "OK", rls_pb2.RateLimitResponse.OVER_LIMIT: "OVER_LIMIT"}
_UNITS = {v.number: v.name for v in rls_pb2.RateLimitResponse.RateLimit.Unit.DESCRIPTOR.values}


def _rpc(service: str, method: str) -> dict[str, str]:
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}


class Spans:
    """Makes the instrumented variants of rls's handlers (one tracer, one propagator)."""

    def __init__(self, tracer: Tracer, propagator: TextMapPropagator, store: str) -> None:
        self.tracer = tracer
        self.propagator = propagator
        self.store = store

    def caller(self, context: grpc.aio.ServicerContext) -> Context:
        """The caller's trace context from the call's metadata (W3C traceparent, B3)."""
        return self.propagator.extract(dict(context.invocation_metadata() or ()), getter=_GETTER)

    def should_rate_limit(self, service: str, behavior: UnaryBehavior) -> UnaryBehavior:
        rpc = _rpc(service, "ShouldRateLimit")
        tracer = self.tracer

        async def traced(data: bytes, context: grpc.aio.ServicerContext) -> bytes:
            span = tracer.start_span("ShouldRateLimit", self.caller(context), SpanKind.SERVER, rpc)
            if not span.is_recording():  # not sampled: nothing to end, no context to set
                return await behavior(data, context)
            with trace.use_span(span, end_on_exit=True):
                try:
                    answer = await behavior(data, context)
                except grpc.aio.AbortError:
                    _aborted(span, context)
                    raise
                span.set_attribute(STORE, self.store)
                _describe_call(span, data, answer)
                return answer

        return traced

    def store_call(self, call: StoreCall) -> StoreCall:
        """The limiter's store call in a child span (only under a recorded server span)."""
        tracer = self.tracer
        store = self.store

        async def traced(
            checks: Sequence[Check], now_ms: int | None, usage: Sequence[UsageOp],
            usage_ttl_ms: int, budget_s: float | None,
        ) -> tuple[list[Outcome] | None, str]:
            parent = trace.get_current_span()
            if not parent.is_recording():
                return await call(checks, now_ms, usage, usage_ttl_ms, budget_s)
            with tracer.start_as_current_span(
                f"{store} decide", kind=SpanKind.CLIENT,
                attributes={STORE: store, CHECKS: len(checks)},
            ) as span:
                outcomes, why = await call(checks, now_ms, usage, usage_ttl_ms, budget_s)
                if why:
                    span.set_attribute(FAILURE, why)
                    span.set_status(Status(StatusCode.ERROR, why))
                    parent.set_attribute(FAILURE, why)
                return outcomes, why

        return traced

    def quota_stream(self, service: str, method: str, behavior: StreamBehavior) -> StreamBehavior:
        """A span per usage report: from its arrival until the stream reads the next one (its
        answer computed and queued), in the trace of the stream's metadata."""
        rpc = _rpc(service, method)
        tracer = self.tracer

        async def reports(requests: AsyncIterator[bytes], parent: Context) -> AsyncIterator[bytes]:
            async for data in requests:
                span = tracer.start_span("RateLimitQuotaUsageReports", parent, SpanKind.SERVER, rpc)
                try:
                    if span.is_recording():
                        _describe_report(span, data)
                    yield data
                finally:
                    span.end()

        async def traced(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
            await behavior(reports(requests, self.caller(context)), context)

        return traced

    def extproc_stream(self, service: str, method: str, behavior: StreamBehavior) -> StreamBehavior:
        """A span per ext_proc stream (one HTTP request through Envoy's response cache)."""
        rpc = _rpc(service, method)
        tracer = self.tracer

        async def traced(requests: Any, context: grpc.aio.ServicerContext) -> None:
            span = tracer.start_span("ext_proc Process", self.caller(context), SpanKind.SERVER, rpc)
            if not span.is_recording():
                await behavior(requests, context)
                return
            with trace.use_span(span, end_on_exit=True):
                try:
                    await behavior(requests, context)
                except grpc.aio.AbortError:
                    _aborted(span, context)
                    raise

        return traced


def _aborted(span: Span, context: grpc.aio.ServicerContext) -> None:
    code = context.code()
    if code is not None:
        span.set_attribute("rpc.grpc.status_code", code.value[0])
        span.set_status(Status(StatusCode.ERROR, f"{code.name}: {context.details() or ''}"))


def _describe_call(span: Span, data: bytes, answer: bytes) -> None:
    """Domain, descriptor count, overall code and the deciding limit, from the call's bytes."""
    request = rls_pb2.RateLimitRequest.FromString(data)
    response = rls_pb2.RateLimitResponse.FromString(answer)
    span.set_attribute(DOMAIN, request.domain)
    span.set_attribute(DESCRIPTORS, len(request.descriptors))
    span.set_attribute(CODE, _CODES.get(response.overall_code, "UNKNOWN"))
    deciding = None
    for status in response.statuses:
        if not status.HasField("current_limit"):
            continue
        if status.code == rls_pb2.RateLimitResponse.OVER_LIMIT:
            deciding = status
            break
        if deciding is None or status.limit_remaining < deciding.limit_remaining:
            deciding = status
    if deciding is not None:
        limit = deciding.current_limit
        span.set_attribute(
            LIMIT, limit.name or f"{limit.requests_per_unit}/{_UNITS.get(limit.unit, '?')}"
        )


def _describe_report(span: Span, data: bytes) -> None:
    try:
        report = rlqs_pb2.RateLimitQuotaUsageReports.FromString(data)
    except DecodeError:
        return  # the stream counts and logs it
    if report.domain:
        span.set_attribute(DOMAIN, report.domain)
    span.set_attribute(BUCKETS, len(report.bucket_quota_usages))
