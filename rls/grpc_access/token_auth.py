"""Optional shared token for the gRPC port (`--grpc-token` / `RLS_GRPC_TOKEN`).

Envoy sends it with every rate-limit (and ext_proc) call when its `grpc_service` carries
`initial_metadata: [{key: authorization, value: "Bearer <token>"}]` (docs/admin.md, "gRPC
port"). Calls without it get UNAUTHENTICATED, counted in rls_grpc_token_refused_total by
reason: `missing` (no `authorization: Bearer …` metadata: an Envoy without the
`initial_metadata`) or `wrong` (another token: one side rotated, or a stranger). grpc.health.v1
stays open: kubelet gRPC probes cannot send metadata. No token set: no interceptor at all (and
no counter), so the hot path pays nothing.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter

REASONS = ("missing", "wrong")
HEALTH_PREFIX = "/grpc.health.v1.Health/"
DENIED = "missing or wrong bearer token in metadata 'authorization'"


def _given(metadata: Any) -> bytes:
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode("latin-1") if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer":
                return token.strip().encode("utf-8", "surrogateescape")
    return b""


class TokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses every call but health checks whose `authorization` metadata lacks the token."""

    def __init__(self, token: str, refused: Counter) -> None:
        self.token = token.encode()
        self.missing = refused.labels("missing")
        self.wrong = refused.labels("wrong")

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(HEALTH_PREFIX):
            return handler
        given = _given(details.invocation_metadata)
        if hmac.compare_digest(given, self.token):
            return handler
        (self.wrong if given else self.missing).inc()
        return _denying(handler)


def _denying(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that answers UNAUTHENTICATED."""

    async def deny(_request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, DENIED)

    codec = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny, **codec)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny, **codec)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny, **codec)
    return grpc.unary_unary_rpc_method_handler(deny, **codec)


def interceptors(token: str, registry: CollectorRegistry) -> list[grpc.aio.ServerInterceptor]:
    """For grpc.aio.server(interceptors=…) of every gRPC listener (one list, one counter, shared
    by them): none unless a token is configured."""
    if not token:
        return []
    refused = Counter(
        "rls_grpc_token_refused",
        "gRPC calls refused UNAUTHENTICATED for the token: none sent (missing) or another "
        "one (wrong)",
        ["reason"],
        registry=registry,
    )
    for reason in REASONS:
        refused.labels(reason)
    return [TokenInterceptor(token, refused)]
