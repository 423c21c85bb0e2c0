"""Fixtures for the tracing tests: an OTLP receiver, rls exporting to it, and a real Envoy 1.40
whose OpenTelemetry tracer exports to the same receiver."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import RlsProcess
from e2e import conftest as e2e_fixtures
from e2e.harness import (
    Backend,
    Envoy,
    Gateway,
    load_gateway,
    start_gateway,
)

from .otlp_receiver import OtlpReceiver

envoy_binary = e2e_fixtures.envoy_binary
backend = e2e_fixtures.backend

DESCRIPTORS = """\
domain: gateway
descriptors:
  - key: user
    descriptors:
      - key: path
        rate_limit: { name: per_user_path, unit: hour, requests_per_unit: 1000 }
  - key: remote_address
    rate_limit: { unit: hour, requests_per_unit: 100000 }
"""

# Envoy's OpenTelemetry exporter sends every 5 s by default: every span at once here.
FAST_FLUSH = {"tracing.opentelemetry.flush_interval_ms": 100,
              "tracing.opentelemetry.min_flush_spans": 1}


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    server = OtlpReceiver().start()
    yield server
    server.stop()


def tracing_env(endpoint: str, protocol: str = "grpc", rate: float = 1.0,
                **extra: str) -> dict[str, str]:
    """The environment Envoy Gateway gives the reference, pointed at `endpoint`."""
    return {
        "TRACING_ENABLED": "true",
        "TRACING_EXPORTER_PROTOCOL": protocol,
        "TRACING_SERVICE_NAME": "RateLimit",
        "TRACING_SERVICE_NAMESPACE": "tests",
        "TRACING_SAMPLING_RATE": str(rate),
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # export within 50 ms (the SDK's default is 5 s)
        **extra,
    }


def with_tracing(config: dict[str, Any], collector_port: int, percent: float) -> dict[str, Any]:
    """Envoy's HTTP connection manager traced with the OpenTelemetry tracer (sampling
    `percent` of requests), exporting over gRPC to a cluster on `collector_port`."""
    listener = config["static_resources"]["listeners"][0]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["tracing"] = {
        "random_sampling": {"value": percent},
        "provider": {
            "name": "envoy.tracers.opentelemetry",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig",
                "grpc_service": {"envoy_grpc": {"cluster_name": "otlp_collector"},
                                 "timeout": "1s"},
                "service_name": "envoy-gateway",
            },
        },
    }
    config["static_resources"]["clusters"].append({
        "name": "otlp_collector",
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3."
                         "HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            },
        },
        "load_assignment": {"cluster_name": "otlp_collector", "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {
                "address": "127.0.0.1", "port_value": collector_port}}}},
        ]}]},
    })
    layers = config.setdefault("layered_runtime", {}).setdefault("layers", [])
    layers.insert(0, {"name": "tracing_flush", "static_layer": FAST_FLUSH})
    return config


@pytest.fixture
def traced_gateway(
    tmp_path: Path, rls_factory: Callable[..., RlsProcess], backend: Backend,
    envoy_binary: str, receiver: OtlpReceiver,
) -> Iterator[Callable[..., Gateway]]:
    """`start(env, envoy_percent)`: rls with `env`, and Envoy on envoy/gateway.yaml traced."""
    started: list[Envoy] = []

    def start(env: dict[str, str], envoy_percent: float = 100.0) -> Gateway:
        descriptor_file = tmp_path / "descriptors.yaml"
        descriptor_file.write_text(DESCRIPTORS)
        rls = rls_factory(descriptor_file, env=env)
        config = with_tracing(load_gateway(), receiver.grpc_port, envoy_percent)
        return start_gateway(envoy_binary, config, tmp_path, rls, [backend], started,
                             {receiver.grpc_port: receiver.grpc_port})

    yield start
    for envoy in started:
        envoy.stop()
