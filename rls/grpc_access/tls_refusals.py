"""Clients refused by gRPC TLS, counted by reason (rls_grpc_tls_refused_total).

Handshake refusals: grpcio tells the application nothing about a failed handshake (no callback,
no counter); grpc-core only writes one line per failure to stderr, e.g.
`ssl_transport_security.cc:2563] Handshake failed with error SSL_ERROR_SSL: error:100000c0:SSL
routines:OPENSSL_internal:PEER_DID_NOT_RETURN_A_CERTIFICATE: …`. HandshakeLog puts a pipe in
front of file descriptor 2: every byte is passed on unchanged to the real stderr at once, and
those lines are counted. grpc writes them at INFO: with GRPC_VERBOSITY=ERROR (or NONE) they
are not written, and not counted.

SAN refusals: grpc cannot require a SAN in the handshake, so SanGuard checks the peer's
certificate (grpc's auth context) at every call and refuses one without it UNAUTHENTICATED.
"""

from __future__ import annotations

import atexit
import inspect
import os
import re
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

REASONS = (
    "no_certificate", "untrusted", "expired", "not_yet_valid", "wrong_usage", "not_tls", "other",
    "wrong_san",
)
_HANDSHAKE = re.compile(
    rb"Handshake failed with error \w+: (?:error:[0-9a-fA-F]+:[^:]*:[^:]*:)?([A-Z0-9_]+)"
    rb"(?:: ([^\n]*))?"
)
_BY_CODE = {
    b"PEER_DID_NOT_RETURN_A_CERTIFICATE": "no_certificate",
    b"WRONG_VERSION_NUMBER": "not_tls",  # plaintext HTTP/2 (a gRPC client without TLS)
    b"HTTP_REQUEST": "not_tls",
    b"HTTPS_PROXY_REQUEST": "not_tls",
}
_BY_DETAIL = {  # CERTIFICATE_VERIFY_FAILED: OpenSSL's verify result says why
    b"certificate has expired": "expired",
    b"certificate is not yet valid": "not_yet_valid",
    b"unsupported certificate purpose": "wrong_usage",  # e.g. a server-only certificate
}
MAX_LINE = 64 * 1024  # longest partial line kept while scanning (the bytes pass on regardless)
_INSTALLED: list[HandshakeLog] = []  # the pipes in front of stderr, innermost last


def restore_stderr() -> None:
    """Give fd 2 back to the real stderr, after what is in the pipe was passed on. For exits
    that skip atexit (os._exit): without it their last log lines stay in the pipe, unread."""
    while _INSTALLED:
        _INSTALLED.pop().uninstall()


def handshake_reason(line: bytes) -> str | None:
    """The refusal reason of one grpc log line; None when it is not a handshake failure."""
    match = _HANDSHAKE.search(line)
    if match is None:
        return None
    code, detail = match.group(1), (match.group(2) or b"").strip()
    if code == b"CERTIFICATE_VERIFY_FAILED":
        return _BY_DETAIL.get(detail, "untrusted")
    return _BY_CODE.get(code, "other")


class HandshakeLog:
    """A pipe in front of stderr (fd 2) that counts grpc's handshake failure lines."""

    def __init__(self, counter: Any) -> None:
        self.counter = counter  # a labelled Counter: counter.labels(reason).inc()
        self.lost = 0  # refusals that could not be counted
        self._saved: int | None = None
        self._thread: threading.Thread | None = None

    def install(self) -> None:
        if self._saved is not None:
            return
        sys.stderr.flush()
        try:
            saved = os.dup(2)
        except OSError:  # no stderr at all: grpc's lines go nowhere, nothing to count
            return
        read_end, write_end = os.pipe()
        self._saved = saved
        _INSTALLED.append(self)
        os.dup2(write_end, 2)
        os.close(write_end)
        self._thread = threading.Thread(
            target=self._pump, args=(read_end, self._saved), name="rls-grpc-log", daemon=True
        )
        self._thread.start()
        atexit.register(self.uninstall)

    def uninstall(self) -> None:
        """Give fd 2 back to the real stderr; the pump forwards what is left and ends."""
        saved, thread = self._saved, self._thread
        if saved is None or thread is None:
            return
        self._saved = None
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved, 2)  # the pipe's last write end closes: the pump reads to EOF
        thread.join(2.0)

    def _pump(self, read_end: int, out: int) -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(read_end, 65536)
            except OSError:
                break
            if not chunk:
                break
            _write_all(out, chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                self._count(line)
            pending = pending[-MAX_LINE:]
        os.close(read_end)

    def _count(self, line: bytes) -> None:
        """Count one line. Never raises and never logs: the pump is the only reader of stderr,
        so a pump that died (or wrote to stderr itself) would block every later write to
        stderr, rls's log lines included, once the pipe is full."""
        reason = handshake_reason(line)
        if reason is None:
            return
        try:
            self.counter.labels(reason).inc()
        except Exception:  # e.g. a multiprocess metrics file on a full disk: the count is lost
            self.lost += 1


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError:  # the real stderr is gone: nothing to pass it to
            return
        view = view[written:]


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
