"""gRPC method handlers that decode their request themselves.

grpc's own `request_deserializer` turns undecodable bytes into UNKNOWN and logs a traceback
per call, so anyone who reaches the port could fill the log at network speed. These handlers
take the raw bytes and answer INVALID_ARGUMENT naming the message type instead (the ext_proc
stream and the RLQS stream decode their messages the same way, in their own loops).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError


async def decode(raw: bytes, message_type: Any, context: grpc.aio.ServicerContext) -> Any:
    """`message_type` from `raw`, or abort the call with INVALID_ARGUMENT."""
    try:
        return message_type.FromString(raw)
    except DecodeError as exc:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"malformed {message_type.DESCRIPTOR.name}: {exc}",
        )


def unary_unary(
    fn: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]],
    request_type: Any,
    response_type: Any,
) -> grpc.RpcMethodHandler:
    async def decoded(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        return await fn(await decode(raw, request_type, context), context)

    return grpc.unary_unary_rpc_method_handler(
        decoded, response_serializer=response_type.SerializeToString
    )


def unary_stream(
    fn: Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]],
    request_type: Any,
    response_type: Any,
) -> grpc.RpcMethodHandler:
    """For servicers that answer with grpc's `ServicerContext.write` (grpc.health.v1 Watch)."""

    async def decoded(raw: bytes, context: grpc.aio.ServicerContext) -> None:
        await fn(await decode(raw, request_type, context), context)

    return grpc.unary_stream_rpc_method_handler(
        decoded, response_serializer=response_type.SerializeToString
    )
