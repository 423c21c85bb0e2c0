"""Clients refused by gRPC TLS at a call, counted by reason (rls_grpc_tls_refused_total).

grpc cannot require a SAN in the handshake, so SanGuard checks the peer's certificate (grpc's
auth context) at every call and refuses one without it UNAUTHENTICATED (reason wrong_san).

Failed handshakes are not counted here: grpcio tells the application nothing about them, and
the one trace grpc-core leaves (a free-text log line) does not tell a client refused by rls from
rls's own failed connection to a server (its xDS control plane). The client sees the failure:
Envoy counts it in its cluster's `ssl.connection_error` and `upstream_cx_connect_fail`.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

REASONS = ("wrong_san",)  # the refusals rls sees: at a call, never in the handshake
SAN_DENIED = "the client certificate does not carry the required SAN"
SAN_PROPERTY = "x509_subject_alternative_name"
MAX_METHODS = 256  # wrapped handlers kept per listener (methods are few; unknown ones bounded)


class SanGuard(grpc.GenericRpcHandler):  # type: ignore[misc]
    """The handlers of `inner`, each refusing (UNAUTHENTICATED) a call whose client certificate
    lacks the SAN (any kind: DNS, URI, e-mail, IP, compared as written).

    A wrapper of the handlers rather than a server interceptor: grpc.aio runs interceptors as
    extra coroutines on every call; here a method's wrapped handler is made once, and a call
    pays one check of the peer's identities (grpc's auth context, the SAN list)."""

    def __init__(self, inner: grpc.GenericRpcHandler, san: str, refused: Any) -> None:
        self.inner = inner
        self.san = san.encode()
        self.refused = refused  # the counter child of reason wrong_san
        self._handlers: dict[str, grpc.RpcMethodHandler | None] = {}

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method
        if method in self._handlers:
            return self._handlers[method]
        handler = self.inner.service(details)
        wrapped = None if handler is None else _checked(handler, self._check)
        if len(self._handlers) < MAX_METHODS:
            self._handlers[method] = wrapped
        return wrapped

    async def _check(self, context: grpc.aio.ServicerContext) -> None:
        # peer_identities() lists the SANs only when the certificate has some (else the CN).
        if context.peer_identity_key() == SAN_PROPERTY and self.san in (
            context.peer_identities() or ()
        ):
            return
        self.refused.inc()
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, SAN_DENIED)


def _checked(
    handler: grpc.RpcMethodHandler,
    check: Callable[[grpc.aio.ServicerContext], Awaitable[None]],
) -> grpc.RpcMethodHandler:
    """`handler` with `check(context)` awaited before its behaviour (same shape and codec)."""
    if handler.request_streaming and handler.response_streaming:
        behavior, factory = handler.stream_stream, grpc.stream_stream_rpc_method_handler
    elif handler.request_streaming:
        behavior, factory = handler.stream_unary, grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        behavior, factory = handler.unary_stream, grpc.unary_stream_rpc_method_handler
    else:
        behavior, factory = handler.unary_unary, grpc.unary_unary_rpc_method_handler

    if inspect.isasyncgenfunction(behavior):
        async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await check(context)
            async for item in behavior(request, context):
                yield item
        wrapped: Callable[..., Any] = stream
    else:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await check(context)
            result = behavior(request, context)
            return await result if inspect.isawaitable(result) else result
        wrapped = call
    return factory(
        wrapped,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def guarded(
    handlers: Sequence[grpc.GenericRpcHandler], san: str, refused: Any
) -> tuple[grpc.GenericRpcHandler, ...]:
    return tuple(SanGuard(handler, san, refused) for handler in handlers)
