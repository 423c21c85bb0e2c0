"""rls's spans, called directly over gRPC with the trace context Envoy would send: sampling
(the rate for new traces, the caller's sampled flag followed), both OTLP transports, the RLQS
report span, and a collector that never answers."""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from conftest import ROOT, RlsProcess, http_get
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc_pb2
from envoy.service.rate_limit_quota.v3 import rlqs_pb2
from envoy.service.ratelimit.v3 import rls_pb2
from prometheus_client.parser import text_string_to_metric_families
from support.waiting import wait_until

from .conftest import DESCRIPTORS, tracing_env
from .otlp_receiver import Blackhole, OtlpReceiver

SHOULD_RATE_LIMIT = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
QUOTA = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"
PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"


@pytest.fixture
def traced_rls(
    tmp_path: Path, rls_factory: Callable[..., RlsProcess]
) -> Callable[[dict[str, str]], RlsProcess]:
    path = tmp_path / "descriptors.yaml"
    path.write_text(DESCRIPTORS)
    return lambda env: rls_factory(path, env=env)


@pytest.fixture
def blackhole() -> Iterator[Blackhole]:
    hole = Blackhole()
    yield hole
    hole.close()


def traceparent(sampled: bool) -> tuple[str, str, str]:
    """(header value, trace id, parent span id) of a fresh caller context."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}", trace_id, span_id


def call(rls: RlsProcess, metadata: tuple[tuple[str, str], ...] = ()) -> float:
    """One ShouldRateLimit; the seconds it took."""
    request = _request()
    with grpc.insecure_channel(rls.grpc_addr) as channel:
        method = channel.unary_unary(SHOULD_RATE_LIMIT)
        started = time.perf_counter()
        answer = method(request.SerializeToString(), metadata=metadata, timeout=5)
        took = time.perf_counter() - started
    assert rls_pb2.RateLimitResponse.FromString(answer).overall_code == 1  # OK
    return took


def _request() -> rls_pb2.RateLimitRequest:
    request = rls_pb2.RateLimitRequest(domain="gateway")
    d = request.descriptors.add()
    for key, value in (("user", "u1"), ("path", "/a")):
        e = d.entries.add()
        e.key, e.value = key, value
    return request


def metric(rls: RlsProcess, name: str, **labels: str) -> float:
    status, text = http_get(rls.http_url + "/metrics")
    assert status == 200
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def test_rate_applies_to_new_traces_and_a_callers_sampled_flag_is_followed(
    traced_rls: Callable[[dict[str, str]], RlsProcess], receiver: OtlpReceiver
) -> None:
    # Rate 0 over OTLP/gRPC: no span for a call without a trace; a sampled caller's is kept.
    never = traced_rls(tracing_env(receiver.grpc_endpoint, "grpc", rate=0.0))
    call(never)
    sampled, trace_id, parent = traceparent(True)
    call(never, (("traceparent", sampled),))
    span = receiver.wait_for("ShouldRateLimit")[0]
    assert (span.trace_id, span.parent_id) == (trace_id, parent)
    assert len(receiver.named("ShouldRateLimit")) == 1  # FIFO export: the first would be here

    # Rate 1 over OTLP/HTTP: a caller that did not sample is followed; new traces all recorded.
    always = traced_rls(tracing_env(receiver.http_endpoint, "http", rate=1.0))
    unsampled, unsampled_trace, _ = traceparent(False)
    call(always, (("traceparent", unsampled),))
    call(always)
    spans = receiver.wait_for("ShouldRateLimit", 2)
    assert len(spans) == 2
    assert spans[1].parent_id == "" and spans[1].trace_id != unsampled_trace


def test_b3_headers_join_the_callers_trace(
    traced_rls: Callable[[dict[str, str]], RlsProcess], receiver: OtlpReceiver
) -> None:
    rls = traced_rls(tracing_env(receiver.grpc_endpoint, "grpc", rate=0.0))
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    call(rls, (("x-b3-traceid", trace_id), ("x-b3-spanid", span_id), ("x-b3-sampled", "1")))
    span = receiver.wait_for("ShouldRateLimit")[0]
    assert (span.trace_id, span.parent_id) == (trace_id, span_id)


def test_each_quota_usage_report_has_a_span_in_the_streams_trace(
    traced_rls: Callable[[dict[str, str]], RlsProcess], receiver: OtlpReceiver
) -> None:
    rls = traced_rls(tracing_env(receiver.grpc_endpoint, "grpc"))
    header, trace_id, parent = traceparent(True)
    report = rlqs_pb2.RateLimitQuotaUsageReports(domain="gateway")
    for name in ("a", "b"):
        usage = report.bucket_quota_usages.add()
        usage.bucket_id.bucket["name"] = name
        usage.time_elapsed.seconds = 1
        usage.num_requests_allowed = 1
    with grpc.insecure_channel(rls.grpc_addr) as channel:
        stream = channel.stream_stream(QUOTA)
        answers = stream(iter([report.SerializeToString()] * 2),
                         metadata=(("traceparent", header),), timeout=10)
        for _ in answers:  # the stream ends once rls answered both reports
            pass
    spans = receiver.wait_for("RateLimitQuotaUsageReports", 2)
    assert {(s.trace_id, s.parent_id) for s in spans} == {(trace_id, parent)}
    assert spans[0].attributes["rls.domain"] == "gateway"
    assert spans[0].attributes["rls.buckets"] == 2


def test_a_collector_that_never_answers_costs_calls_nothing_and_drops_are_counted(
    traced_rls: Callable[[dict[str, str]], RlsProcess], blackhole: Blackhole
) -> None:
    traced = traced_rls(tracing_env(
        blackhole.endpoint, "http", OTEL_BSP_MAX_QUEUE_SIZE="16",
        OTEL_BSP_MAX_EXPORT_BATCH_SIZE="4", OTEL_EXPORTER_OTLP_TIMEOUT="30",
    ))
    plain = traced_rls({})
    traced_s, plain_s = [], []
    for _ in range(150):  # alternating, so both see the same machine load
        traced_s.append(call(traced))
        plain_s.append(call(plain))
    wait_until(lambda: metric(traced, "rls_tracing_spans_total",
                              outcome="dropped_queue_full") > 0,
               what="dropped spans counted", log=traced.log)
    # The exporter waits up to 30 s for the first batch: had a call waited for the collector,
    # it would take that long. The medians differ by the cost of two spans, not by a wait.
    assert max(traced_s) < 2.0, max(traced_s)
    assert statistics.median(traced_s) < statistics.median(plain_s) * 3 + 0.002
    assert metric(traced, "rls_tracing_spans_total", outcome="exported") == 0


def test_each_ext_proc_stream_has_a_span_in_the_callers_trace(
    receiver: OtlpReceiver, rls_factory: Callable[..., RlsProcess], tmp_path: Path,
) -> None:
    descriptors = tmp_path / "descriptors.yaml"
    descriptors.write_text(DESCRIPTORS)
    rls = rls_factory(descriptors, args=("--cache-config", str(ROOT / "config" / "cache.yaml")),
                      env=tracing_env(receiver.grpc_endpoint, "grpc"))
    header, trace_id, parent = traceparent(True)
    request = ext_proc_pb2.ProcessingRequest()
    for name, value in ((":method", "GET"), (":path", "/items"), (":authority", "api")):
        h = request.request_headers.headers.headers.add()
        h.key, h.raw_value = name, value.encode()
    with grpc.insecure_channel(rls.extproc_addr) as channel:
        stream = channel.stream_stream(PROCESS)
        replies = list(stream(iter([request.SerializeToString()]),
                              metadata=(("traceparent", header),), timeout=10))
    assert replies  # rls answered the request headers
    span = receiver.wait_for("ext_proc Process")[0]
    assert (span.trace_id, span.parent_id) == (trace_id, parent)


def test_a_refused_call_keeps_its_grpc_status_and_its_span_says_why(
    traced_rls: Callable[[dict[str, str]], RlsProcess], receiver: OtlpReceiver
) -> None:
    rls = traced_rls(tracing_env(receiver.grpc_endpoint, "grpc"))
    empty_domain = rls_pb2.RateLimitRequest(domain="").SerializeToString()
    with grpc.insecure_channel(rls.grpc_addr) as channel, pytest.raises(grpc.RpcError) as err:
        channel.unary_unary(SHOULD_RATE_LIMIT)(empty_domain, timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    span = receiver.wait_for("ShouldRateLimit")[0]
    assert span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
