"""What tracing does to a decision: nothing at all when off; when on, the store call inside a
server span is a child span named after the store. Its settings read from the reference's
TRACING_* names with located errors, the failure-mode reason on the spans of a call the store
could not decide."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from rls.cli.main import parser
from rls.cli.serve import settings_from
from rls.engine.decision import OK, OVER_LIMIT
from rls.engine.limiter import DescriptorIn, RateLimiter
from rls.process.server import Server
from rls.settings import Settings
from rls.tracing.wiring import Tracing

DESCRIPTORS = """
domain: traced
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
"""
T0 = 1_699_999_200_000


def _server(tmp_path: Path, **settings: object) -> Server:
    """A built (not started) rls with a config loaded: what a decision needs, nothing more."""
    config = tmp_path / "traced.yaml"
    config.write_text(DESCRIPTORS)
    server = Server(Settings(config=[str(config)], **settings))  # type: ignore[arg-type]
    assert server.app.holder.reload()
    return server


async def _decide_twice(limiter: RateLimiter) -> list[int]:
    codes = []
    for _ in range(2):
        decision = await limiter.should_rate_limit(
            "traced", [DescriptorIn((("user", "ann"),))], 0, T0)
        codes.append(decision.overall)
    return codes


def test_tracing_off_decides_through_the_store_without_any_span_machinery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = _server(tmp_path)
    assert server.tracing is None
    limiter = server.app.limiter
    assert limiter.call_store == limiter.store.decide  # the store policy's own call, unwrapped

    def no_spans(*args: object, **kwargs: object) -> None:
        raise AssertionError("a decision looked for a span with tracing off")

    monkeypatch.setattr(otel_trace, "get_current_span", no_spans)
    monkeypatch.setattr(otel_trace, "get_tracer", no_spans)
    assert asyncio.run(_decide_twice(limiter)) == [OK, OVER_LIMIT]


def test_tracing_on_puts_the_store_call_in_a_child_span_named_after_the_store(
    tmp_path: Path,
) -> None:
    limiter = _server(tmp_path).app.limiter
    memory = InMemorySpanExporter()
    tracing = Tracing(Settings(tracing_enabled=True), CollectorRegistry(), limiter,
                      exporter=memory)
    tracer = tracing.provider.get_tracer("test")

    async def decide_in_a_server_span() -> list[int]:
        with tracer.start_as_current_span("ShouldRateLimit"):
            return await _decide_twice(limiter)

    assert asyncio.run(decide_in_a_server_span()) == [OK, OVER_LIMIT]
    assert asyncio.run(_decide_twice(limiter)) == [OVER_LIMIT, OVER_LIMIT]  # no server span
    assert tracing.flush(5.0)
    spans = memory.get_finished_spans()
    server_spans = [s for s in spans if s.name == "ShouldRateLimit"]
    store_spans = [s for s in spans if s.name == f"{limiter.backend.name} decide"]
    assert len(server_spans) == 1
    # One store span per decision made inside the server span, none for those outside it.
    assert len(store_spans) == 2 and len(spans) == 3
    for span in store_spans:
        assert span.parent is not None
        assert span.parent.span_id == server_spans[0].context.span_id
        assert span.attributes is not None and span.attributes["rls.store"] == "memory"


def test_reference_tracing_variables_are_read_and_bad_values_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = parser().parse_args(["serve"])
    monkeypatch.setenv("TRACING_ENABLED", "true")
    monkeypatch.setenv("TRACING_EXPORTER_PROTOCOL", "GRPC")
    monkeypatch.setenv("TRACING_SERVICE_INSTANCE_ID", "rls-0")
    monkeypatch.setenv("TRACING_SAMPLING_RATE", "0.25")
    settings = settings_from(args)
    assert (settings.tracing_enabled, settings.tracing_protocol) == (True, "grpc")
    assert (settings.tracing_service_name, settings.tracing_service_instance_id) == (
        "RateLimit", "rls-0")
    assert settings.tracing_sampling_rate == 0.25
    monkeypatch.setenv("TRACING_SAMPLING_RATE", "1.5")
    with pytest.raises(ValueError, match=r"^TRACING_SAMPLING_RATE: 1.5 is not between 0 and 1"):
        settings_from(args)
    monkeypatch.setenv("TRACING_SAMPLING_RATE", "1")
    monkeypatch.setenv("TRACING_EXPORTER_PROTOCOL", "udp")
    with pytest.raises(ValueError, match=r"^TRACING_EXPORTER_PROTOCOL: 'udp' is not one of"):
        settings_from(args)


class _FailingLimiter:
    """A limiter stand-in whose store call fails the way a dead Redis does."""

    class backend:
        name = "redis"

    async def call_store(self, *args: object) -> tuple[None, str]:
        return None, "store_down"


def test_a_store_failure_names_its_reason_on_the_store_and_server_spans() -> None:
    memory = InMemorySpanExporter()
    limiter = _FailingLimiter()
    tracing = Tracing(Settings(tracing_enabled=True), CollectorRegistry(), limiter,  # type: ignore[arg-type]
                      exporter=memory)
    tracer = tracing.provider.get_tracer("test")

    async def decide() -> None:
        with tracer.start_as_current_span("ShouldRateLimit"):
            assert await limiter.call_store([], None, None, 0, None) == (None, "store_down")

    asyncio.run(decide())
    assert tracing.flush(5.0)
    spans = {s.name: s for s in memory.get_finished_spans()}
    assert spans["redis decide"].attributes["rls.failure_reason"] == "store_down"
    assert spans["ShouldRateLimit"].attributes["rls.failure_reason"] == "store_down"
    assert spans["redis decide"].parent.span_id == spans["ShouldRateLimit"].context.span_id


def test_a_span_queue_smaller_than_the_default_batch_starts_with_the_batch_cut_to_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OTEL_BSP_MAX_QUEUE_SIZE below the default batch (512) is a valid setting for the
    reference's Go SDK, which cuts the batch to the queue; the Python SDK raised instead."""
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "100")
    tracing = Tracing(Settings(tracing_enabled=True), CollectorRegistry(),
                      Server(Settings()).app.limiter, exporter=InMemorySpanExporter())
    queue = tracing.processor._queue
    assert queue is not None and queue.maxlen == 100


@pytest.mark.parametrize(("protocol", "variable", "value", "named"), [
    ("http", "OTEL_BSP_MAX_QUEUE_SIZE", "0", "OTEL_BSP_MAX_QUEUE_SIZE"),
    ("http", "OTEL_BSP_SCHEDULE_DELAY", "0", "OTEL_BSP_SCHEDULE_DELAY"),
    ("http", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "-1", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"),
    ("grpc", "OTEL_EXPORTER_OTLP_TIMEOUT", "abc", "OTEL_EXPORTER_OTLP_TIMEOUT=abc"),
    ("grpc", "OTEL_EXPORTER_OTLP_COMPRESSION", "zstd", "OTEL_EXPORTER_OTLP_COMPRESSION"),
])
def test_otel_variables_the_exporter_cannot_use_stop_the_start_in_one_line_naming_them(
    monkeypatch: pytest.MonkeyPatch, protocol: str, variable: str, value: str, named: str
) -> None:
    from rls.cli.serve import startup_problem

    monkeypatch.setenv(variable, value)
    settings = Settings(tracing_enabled=True, tracing_protocol=protocol, allow_empty_config=True)
    problem = startup_problem(settings)
    assert problem is not None and named in problem and "\n" not in problem
    assert startup_problem(Settings(allow_empty_config=True)) is None  # tracing off: not read
