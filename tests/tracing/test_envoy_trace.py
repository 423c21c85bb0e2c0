"""One trace across a real Envoy 1.40 and rls: Envoy's OpenTelemetry tracer and rls both export
to the same in-test OTLP receiver, and rls's span hangs under the span of Envoy's rate-limit
call (the ratelimit filter sends the context as `traceparent` gRPC metadata)."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from e2e.harness import Gateway
from envoy.service.ratelimit.v3 import rls_pb2
from support.waiting import wait_until

from .conftest import tracing_env
from .otlp_receiver import OtlpReceiver, SpanSeen

pytestmark = pytest.mark.envoy


def test_rls_span_is_a_child_of_envoys_rate_limit_call_in_one_trace(
    traced_gateway: Callable[..., Gateway], receiver: OtlpReceiver
) -> None:
    gw = traced_gateway(tracing_env(receiver.grpc_endpoint, "grpc"))
    user = next(iter(gw.api_keys))
    assert gw.call("/traced", user).status == 200

    ours = receiver.wait_for("ShouldRateLimit")[-1]
    wait_until(lambda: len(envoy_spans(receiver, ours.trace_id)) >= 2,
               what="Envoy's spans of the traced request", log=gw.logs)
    envoy = envoy_spans(receiver, ours.trace_id)
    assert ours.parent_id in envoy, (ours, envoy)
    call = envoy[ours.parent_id]  # Envoy's egress span of its rate-limit call
    assert call.parent_id in envoy  # under the span of the HTTP request it decides
    assert ours.attributes["rls.domain"] == "gateway"
    assert ours.attributes["rls.code"] == "OK"
    assert ours.attributes["rls.store"] == "memory"
    assert ours.attributes["rls.descriptors"] >= 1
    assert ours.attributes["rls.limit"] == "per_user_path"
    assert ours.resource["service.namespace"] == "tests"
    wait_until(lambda: child_spans(receiver, ours), what="rls's store span")
    assert [s.name for s in child_spans(receiver, ours)] == ["memory decide"]


def envoy_spans(receiver: OtlpReceiver, trace_id: str) -> dict[str, SpanSeen]:
    return {s.span_id: s for s in receiver.in_trace(trace_id) if s.service == "envoy-gateway"}


def child_spans(receiver: OtlpReceiver, parent: SpanSeen) -> list[SpanSeen]:
    return [s for s in receiver.in_trace(parent.trace_id) if s.parent_id == parent.span_id]


def test_a_request_envoy_did_not_sample_is_not_recorded_by_rls_even_at_rate_1(
    traced_gateway: Callable[..., Gateway], receiver: OtlpReceiver
) -> None:
    gw = traced_gateway(tracing_env(receiver.grpc_endpoint, "grpc", rate=1.0), envoy_percent=0)
    user = next(iter(gw.api_keys))
    for _ in range(5):
        assert gw.call("/unsampled", user).status == 200
    # A call straight to rls, without a trace context: recorded (rate 1), and exported after
    # any span of the calls above would have been (the export queue is first in, first out).
    request = rls_pb2.RateLimitRequest(domain="gateway")
    entry = request.descriptors.add().entries.add()
    entry.key, entry.value = "remote_address", "10.0.0.1"
    with grpc.insecure_channel(gw.rls.grpc_addr) as channel:
        channel.unary_unary("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")(
            request.SerializeToString(), timeout=5)
    spans = receiver.wait_for("ShouldRateLimit")
    assert [(s.parent_id, s.attributes["rls.descriptors"]) for s in spans] == [("", 1)], spans
    assert not [s for s in receiver.spans if s.service == "envoy-gateway"]
