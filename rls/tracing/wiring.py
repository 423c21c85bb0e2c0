"""Tracing on: the OpenTelemetry provider, its OTLP exporter, and the instrumented handlers.

Imported by the server only when tracing is on (`--tracing-enabled`, `TRACING_ENABLED`), so
an rls without tracing never loads OpenTelemetry. Spans leave through the SDK's
BatchSpanProcessor: ended spans go to a bounded queue (`OTEL_BSP_MAX_QUEUE_SIZE`, 2048) that
a background thread exports in batches; a full queue drops spans (counted in
`rls_tracing_spans_total{outcome="dropped_queue_full"}`), so a collector that is down or slow
costs decisions nothing but those dropped spans. The exporter reads the standard variables
itself (`OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`, `_HEADERS`, `_CERTIFICATE`, `_TIMEOUT`, ...).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from opentelemetry.propagators.b3 import B3MultiFormat, B3SingleFormat
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.environment_variables import (
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
    OTEL_BSP_MAX_QUEUE_SIZE,
    OTEL_BSP_SCHEDULE_DELAY,
)
from opentelemetry.sdk.resources import (
    SERVICE_INSTANCE_ID,
    SERVICE_NAME,
    SERVICE_NAMESPACE,
    Resource,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import CollectorRegistry, Counter

from rls.engine.limiter import RateLimiter
from rls.services import extproc, quota, ratelimit
from rls.settings import Settings
from rls.settings.environment import env_text, env_with_prefix
from rls.tracing import otlp_compat
from rls.tracing.spans import Spans

log = logging.getLogger("rls.tracing")

Wrap = Callable[[Any], Any]


class _CountedExporter(SpanExporter):
    """The OTLP exporter, with every span it could not deliver counted."""

    def __init__(self, exporter: SpanExporter, exported: Counter, failed: Counter) -> None:
        self.exporter = exporter
        self._exported = exported
        self._failed = failed

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self.exporter.export(spans)
        (self._exported if result == SpanExportResult.SUCCESS else self._failed).inc(len(spans))
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


class _CountedBatches(BatchSpanProcessor):
    """The SDK's BatchSpanProcessor, counting the spans its full queue drops.

    The SDK drops the oldest queued span when a new one finds the queue full, and only logs
    it; the count reads the SDK's queue (a bounded deque) before each span goes in."""

    def __init__(self, exporter: SpanExporter, dropped: Counter) -> None:
        queue, batch, delay = batch_options()
        super().__init__(
            exporter, max_queue_size=queue, max_export_batch_size=batch,
            schedule_delay_millis=delay,
        )
        self._dropped = dropped
        self._queue = getattr(getattr(self, "_batch_processor", None), "_queue", None)
        if self._queue is None:
            log.warning("this OpenTelemetry SDK hides its span queue: drops are not counted")

    def on_end(self, span: ReadableSpan) -> None:
        queue = self._queue
        if queue is not None and queue.maxlen is not None and len(queue) >= queue.maxlen:
            if span.context is not None and span.context.trace_flags.sampled:
                self._dropped.inc()
        super().on_end(span)


class TracingSetupError(ValueError):
    """The OTEL_* variables give values the exporter or its span queue cannot use."""


BSP_DEFAULTS = {  # the OpenTelemetry defaults (the specification's, the Go and Python SDKs')
    OTEL_BSP_MAX_QUEUE_SIZE: 2048,
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE: 512,
    OTEL_BSP_SCHEDULE_DELAY: 5000,
}


def batch_options(warn: bool = True) -> tuple[int, int, int]:
    """The span queue's length, the export batch and its delay (ms) from OTEL_BSP_*, read
    here because the SDK's own reading logs a traceback for a non-number and its check raises
    a ValueError naming no variable. A non-number means the default (one warning, as the Go
    SDK); zero or less stops the start; a batch longer than the queue is cut to it, as the
    reference's Go SDK does (the Python SDK refuses to start)."""
    values: dict[str, int] = {}
    for name, default in BSP_DEFAULTS.items():
        text = env_text(name)
        try:
            values[name] = int(text) if text else default
        except ValueError:
            if warn:  # once, from the server (not again from the start-up check)
                log.warning("%s=%r is not a whole number: the default %d applies", name, text,
                            default)
            values[name] = default
        if values[name] <= 0:
            raise TracingSetupError(f"{name}: {values[name]} is not a positive number")
    queue = values[OTEL_BSP_MAX_QUEUE_SIZE]
    batch = min(values[OTEL_BSP_MAX_EXPORT_BATCH_SIZE], queue)
    return queue, batch, values[OTEL_BSP_SCHEDULE_DELAY]


def setup_problem(settings: Settings) -> str | None:
    """Why tracing cannot start with these OTEL_* variables (one line naming them), else None.

    The exporter is built once and dropped: it reads its variables when built (the gRPC one
    raises on a timeout or compression it cannot parse), before any connection is made."""
    try:
        batch_options(warn=False)
        _exporter(settings.tracing_protocol).shutdown()
    except TracingSetupError as exc:
        return f"tracing: {exc}"
    except Exception as exc:  # whatever the SDK raises on a value it rejects
        return (f"tracing: the OTLP/{settings.tracing_protocol} exporter cannot start: "
                f"{' '.join(str(exc).split())} (from {_otlp_variables()})")
    return None


def _otlp_variables() -> str:
    """The OTEL_EXPORTER_OTLP_* variables set, with their values (headers' withheld: they
    carry credentials)."""
    given = [f"{k}=…" if "HEADERS" in k else f"{k}={v}"
             for k, v in sorted(env_with_prefix("OTEL_EXPORTER_OTLP_").items())]
    return ", ".join(given) or "no OTEL_EXPORTER_OTLP_* variable"


def _exporter(protocol: str) -> SpanExporter:
    """The OTLP span exporter of `protocol`; it reads the OTEL_EXPORTER_OTLP_* variables."""
    otlp_compat.install()  # before the first import of the OTLP messages
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter()


def _resource(settings: Settings) -> Resource:
    attributes: dict[str, str] = {
        SERVICE_NAME: settings.tracing_service_name,
        SERVICE_INSTANCE_ID: settings.tracing_service_instance_id or str(uuid.uuid4()),
    }
    if settings.tracing_service_namespace:
        attributes[SERVICE_NAMESPACE] = settings.tracing_service_namespace
    return Resource.create(attributes)


class Tracing:
    """One process's tracer provider and the wrappers that put its spans on the handlers."""

    def __init__(
        self,
        settings: Settings,
        registry: CollectorRegistry,
        limiter: RateLimiter,
        exporter: SpanExporter | None = None,
    ) -> None:
        """Start the provider and put the store-call span on `limiter` (once)."""
        spans_total = Counter(
            "rls_tracing_spans", "Spans by fate: exported, or dropped and why", ["outcome"],
            registry=registry,
        )
        self.exported = spans_total.labels("exported")
        self.dropped_full = spans_total.labels("dropped_queue_full")
        self.failed = spans_total.labels("dropped_export_failed")
        self.provider = TracerProvider(
            sampler=ParentBased(TraceIdRatioBased(settings.tracing_sampling_rate)),
            resource=_resource(settings),
            shutdown_on_exit=False,  # flush() at the drain, bounded; never a wait at exit
        )
        inner = exporter if exporter is not None else _exporter(settings.tracing_protocol)
        self.processor = _CountedBatches(
            _CountedExporter(inner, self.exported, self.failed), self.dropped_full
        )
        self.provider.add_span_processor(self.processor)
        # Envoy's OpenTelemetry tracer sends W3C traceparent; its Zipkin tracer B3 headers.
        self.propagator = CompositePropagator([
            B3MultiFormat(), B3SingleFormat(), TraceContextTextMapPropagator(),
        ])
        self.spans = spans = Spans(
            self.provider.get_tracer("rls"), self.propagator, limiter.backend.name
        )
        limiter.call_store = spans.store_call(limiter.call_store)
        self.wraps: dict[str, Wrap] = {
            f"/{ratelimit.SERVICE_NAME}/ShouldRateLimit":
                lambda b: spans.should_rate_limit(ratelimit.SERVICE_NAME, b),
            f"/{quota.SERVICE_NAME}/{quota.METHOD_NAME}":
                lambda b: spans.quota_stream(quota.SERVICE_NAME, quota.METHOD_NAME, b),
            f"/{extproc.SERVICE_NAME}/Process":
                lambda b: spans.extproc_stream(extproc.SERVICE_NAME, "Process", b),
        }
        log.info(
            "tracing on: OTLP/%s, sampling %g of new traces (callers' sampled flag kept)",
            settings.tracing_protocol, settings.tracing_sampling_rate,
        )

    def instrument(
        self, handlers: Sequence[grpc.GenericRpcHandler]
    ) -> tuple[grpc.GenericRpcHandler, ...]:
        """`handlers` with their methods' server spans."""
        return tuple(TracedHandler(h, self.wraps) for h in handlers)

    def flush(self, seconds: float) -> bool:
        """Export what is queued, waiting at most `seconds` (blocking: run it off the loop).

        The export runs on a daemon thread: a collector that does not answer leaves it behind
        (the process exits anyway), never the caller."""
        done = threading.Event()

        def run() -> None:
            self.provider.force_flush(int(seconds * 1000))
            done.set()

        threading.Thread(target=run, name="rls-trace-flush", daemon=True).start()
        return done.wait(seconds)


class TracedHandler(grpc.GenericRpcHandler):  # type: ignore[misc]
    """A generic handler whose methods named in `wraps` run inside their span.

    Each method's wrapped handler is made once, at its first call, and kept."""

    def __init__(self, inner: grpc.GenericRpcHandler, wraps: dict[str, Wrap]) -> None:
        self._inner = inner
        self._wraps = wraps
        self._made: dict[str, grpc.RpcMethodHandler] = {}

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method
        made = self._made.get(method)
        if made is not None:
            return made
        handler = self._inner.service(details)
        wrap = self._wraps.get(method)
        if handler is None or wrap is None:
            return handler
        if handler.unary_unary is not None:
            made = handler._replace(unary_unary=wrap(handler.unary_unary))
        else:
            made = handler._replace(stream_stream=wrap(handler.stream_stream))
        self._made[method] = made
        return made
