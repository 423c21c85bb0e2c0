"""grpc.health.v1 via grpcio-health-checking; NOT_SERVING while draining."""

from __future__ import annotations

from grpc_health.v1 import health, health_pb2

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
