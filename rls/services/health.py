"""grpc.health.v1 via grpcio-health-checking; NOT_SERVING while draining."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2

from rls.services import decoding
from rls.services.ratelimit import SERVICE_NAME

SERVICES = ("", "ratelimit", SERVICE_NAME)


def create_health() -> health.aio.HealthServicer:
    servicer = health.aio.HealthServicer()
    return servicer


async def set_serving(servicer: health.aio.HealthServicer, serving: bool) -> None:
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in SERVICES:
        await servicer.set(name, status)


def health_handler(servicer: health.aio.HealthServicer) -> grpc.GenericRpcHandler:
    """grpc.health.v1 with grpcio-health-checking's servicer, requests decoded by the handler
    so that garbage is INVALID_ARGUMENT rather than a logged traceback (services/decoding.py)."""
    request, response = health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse
    return grpc.method_handlers_generic_handler(
        "grpc.health.v1.Health",
        {
            "Check": decoding.unary_unary(servicer.Check, request, response),
            "Watch": decoding.unary_stream(servicer.Watch, request, response),
        },
    )
