"""ShouldRateLimit over real gRPC, for the xDS suites."""

from __future__ import annotations

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT


def request(domain: str, *entries: tuple[str, str], hits: int = 0) -> rls_pb2.RateLimitRequest:
    descriptor = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    return rls_pb2.RateLimitRequest(domain=domain, descriptors=[descriptor], hits_addend=hits)


def decide(addr: str, domain: str, *entries: tuple[str, str], hits: int = 0) -> int:
    """The overall code of one ShouldRateLimit call."""
    with grpc.insecure_channel(addr) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        response = stub.ShouldRateLimit(request(domain, *entries, hits=hits), timeout=5)
    return int(response.overall_code)


def health(addr: str) -> str:
    """grpc.health.v1 status of the `ratelimit` service: SERVING, NOT_SERVING..."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(addr) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        answer = stub.Check(health_pb2.HealthCheckRequest(service="ratelimit"), timeout=5)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status))
