"""gRPC `envoy.service.ext_proc.v3.ExternalProcessor/Process`: the response cache (grpc.aio).

Envoy opens one bidi stream per HTTP request and, with the filter config of
envoy/gateway-cache.yaml, sends only the request headers unless this servicer asks for more.
Every message gets exactly one reply, in order (envoy.md §5). The flow:

- request_headers: no rule, or a request that bypasses the cache → reply with `mode_override`
  {response headers SEND} only, so the response can be marked `x-cache: BYPASS` (the reason is a
  metric label). The key needs the body and there is one → reply with `mode_override` {request
  body BUFFERED, response headers SEND} and look up on request_body. Otherwise look up now.
  Hit → ImmediateResponse (`x-cache: HIT`, `age`); miss → `mode_override` {response headers
  SEND} (body still NONE).
- response_headers: add `x-cache: MISS` when the headers allow storing (status,
  Cache-Control, Set-Cookie, Vary, Content-Length within max_entry_bytes) and opt into the body
  with `mode_override` {response body BUFFERED}; otherwise add `x-cache: BYPASS`.
- response_body (end_of_stream true, within max_entry_bytes): hand the store to the cache's
  writer, then reply. Too large or partial: reply with `x-cache: BYPASS` (header mutations in a
  body reply apply in BUFFERED mode, when the headers are still held).

Every write (a miss's store, a hit's TTL refresh) is handed to the writer *before* the reply
that ends the stream is written: Envoy ends the stream on that reply and grpc.aio cancels this
handler, so work started after the write may never start (rls/response_cache/writer.py). The reply
still never waits for the store.

Why the body is asked for only at response_headers, measured on Envoy 1.40: with BUFFERED
asked at request time, Envoy buffers the response body while it waits for the
response_headers reply, and a body over the stream's buffer limit becomes a 500
(`response_payload_too_large`) for the client, whatever the reply says. The limit is small for
requests with a body: the buffer filter sets the stream limit to its max_request_bytes (64 KiB
in the gateway), so every POST response over 64 KiB failed. With body NONE, Envoy holds the
body under flow control instead, and BUFFERED is requested only for a body known to fit
(max_entry_bytes must not exceed the route's buffer limit). A body without Content-Length
(chunked) is not cached unless the rule says `unknown_length: buffer`; BUFFERED_PARTIAL,
which would suit it, hung on bodies over the limit.

Who may call it: the servicer runs on a listener of its own, `--extproc-addr`, loopback by
default, since every stream can write entries served to every user (rls.process.server builds
it; docs/cache.md, "Who can write to the cache"). Headers Envoy never sends (a 5,000-digit
`:status`) are `malformed_header` bypasses (response_cache/entry.py, header_problem); a message that
does not decode ends the stream INVALID_ARGUMENT.

Envoy honours each `mode_override` only if `allow_mode_override` is on and
`allowed_override_modes` lists the resulting mode in full, trailer modes included (see
gateway-cache.yaml). When the stream ends with a cancel instead of a clean end, that is normal.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import duration_pb2
from prometheus_client import CollectorRegistry

from rls.response_cache.cache import Fill, RequestKey, ResponseCache, StoredResponse
from rls.response_cache.config import CacheConfig, CacheRule, load_cache_config
from rls.response_cache.entry import (
    Entry,
    cache_control,
    header_problem,
    never_store_reason,
    status_code,
    storable_headers,
    vary_names,
)
from rls.response_cache.jsonbody import Body, body_weight, key_members
from rls.response_cache.keys import Headers, select_rule
from rls.response_cache.metrics import CacheMetrics
from rls.response_cache.store import create_store
from rls.response_cache.writer import WriteJob
from rls.services.decoding import decode
from rls.settings.model import is_loopback

log = logging.getLogger("rls.cache")

SERVICE_NAME = "envoy.service.ext_proc.v3.ExternalProcessor"
ATTRIBUTES = "envoy.filters.http.ext_proc"
DETAILS = "served_from_cache"
WEIGHT_NAMESPACE, WEIGHT_KEY = "rls", "hits"  # %DYNAMIC_METADATA(rls:hits)%

_PM = processing_mode_pb2.ProcessingMode
# Asked for at request time: response headers only. The body is opted into from the reply to
# response_headers, once the headers show the response is storable and small enough.
RESPONSE_HEADERS = _PM(response_header_mode=_PM.SEND, response_body_mode=_PM.NONE)
REQUEST_BODY_AND_RESPONSE_HEADERS = _PM(
    request_body_mode=_PM.BUFFERED, response_header_mode=_PM.SEND, response_body_mode=_PM.NONE
)
RESPONSE_BODY = _PM(response_header_mode=_PM.SEND, response_body_mode=_PM.BUFFERED)
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
_APPEND = base_pb2.HeaderValueOption.APPEND_IF_EXISTS_OR_ADD
# Asked of Envoy on top of the coalescing wait: the lookup after it (a Vary pointer and its
# entry, two store calls of up to store_timeout_ms each) plus this much for the reply.
WAIT_SLACK = 0.05
# Buffered bodies arrive in one message: room for a body at Envoy's buffer limits.
EXTPROC_MAX_MESSAGE = 16 << 20


@dataclass(slots=True)
class _Stream:
    """Per-HTTP-request state. `phase`: idle → body? → fill → response_body → done, or
    idle → body? → bypass (response headers get `x-cache: BYPASS`) → done."""

    phase: str = "idle"
    rule: CacheRule | None = None
    method: str = ""
    headers: Headers | None = None
    skip_read: bool = False
    pending_bypass: str | None = None  # decided at request_headers, applied once the body is in
    rk: RequestKey | None = None
    fill: Fill | None = None
    status: int = 0
    stored_headers: tuple[tuple[str, bytes], ...] = ()
    vary: frozenset[str] = frozenset()


Reply = tuple[pb.ProcessingResponse, WriteJob | None]
AskForTime = Callable[[float], Awaitable[None]]


class ExtProcService:
    def __init__(self, cache: ResponseCache) -> None:
        self.cache = cache
        self.metrics = cache.metrics

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                # Raw bytes in, decoded by `process` (rls/services/decoding.py).
                "Process": grpc.stream_stream_rpc_method_handler(
                    self.process,
                    response_serializer=pb.ProcessingResponse.SerializeToString,
                )
            },
        )

    async def process(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        """One stream: read a message, hand any write to the writer, then write the reply."""
        st = _Stream()
        headroom = 2 * self.cache.store.timeout + WAIT_SLACK

        async def ask_for_time(wait: float) -> None:
            # Not a reply: Envoy restarts its message timer (up to max_message_timeout) and
            # ignores the request (counting it) when max_message_timeout is 0.
            timeout = duration_pb2.Duration()
            timeout.FromMilliseconds(int((wait + headroom) * 1000))
            await context.write(pb.ProcessingResponse(override_message_timeout=timeout))

        try:
            while True:
                raw = await context.read()
                if raw is grpc.aio.EOF:
                    return
                # Decoded here: an undecodable message is INVALID_ARGUMENT, not grpc's UNKNOWN
                # with a traceback (tests' fake streams hand over decoded messages).
                request = raw if isinstance(raw, pb.ProcessingRequest) else await decode(
                    raw, pb.ProcessingRequest, context)
                reply, job = await self._handle(st, request, ask_for_time)
                if job is not None:
                    # Before the reply: once Envoy has it, it ends the stream and this handler
                    # may be cancelled at any await. submit() does not await.
                    self.cache.writer.submit(job)
                    st.fill = None  # the job owns it now (released when written or dropped)
                await context.write(reply)
        except (grpc.RpcError, ConnectionError):
            return  # Envoy may end a stream with an error after the last reply: normal
        finally:
            # A cancel (Envoy ending the stream, server shutdown) propagates, after cleanup.
            if st.fill is not None:
                st.fill.release()

    async def _handle(
        self, st: _Stream, request: pb.ProcessingRequest, ask: AskForTime
    ) -> Reply:
        kind = request.WhichOneof("request")
        if kind == "request_headers" and st.phase == "idle":
            return await self._request_headers(st, request, ask)
        if kind == "request_body" and st.phase == "body":
            return await self._request_body(st, request.request_body, ask)
        if kind == "response_headers" and st.phase == "fill":
            return self._response_headers(st, request.response_headers)
        if kind == "response_headers" and st.phase == "bypass":
            st.phase = "done"
            return _marked("response_headers", b"BYPASS"), None
        if kind == "response_body" and st.phase == "response_body":
            return self._response_body(st, request.response_body)
        return _empty(kind), None

    # ------------------------------------------------------------------ request side

    async def _request_headers(
        self, st: _Stream, request: pb.ProcessingRequest, ask: AskForTime
    ) -> Reply:
        msg = request.request_headers
        headers = Headers.from_proto(msg.headers)
        method = headers.text(":method")
        rule, reason = select_rule(self.cache.config, method, _attributes(request), headers)
        st.phase = "done"
        if rule is None:
            return self._bypass(st, reason, "request_headers")
        directives = cache_control(headers)
        st.rule, st.method, st.headers = rule, method, headers
        if "no-store" in directives:
            st.pending_bypass = "request_no_store"
        st.skip_read = "no-cache" in directives
        # A bypassed request still needs its weight: hits_from does not depend on caching.
        wants_body = rule.hits_from is not None if st.pending_bypass else rule.needs_body
        if wants_body and not msg.end_of_stream:
            st.phase = "body"
            reply = _empty("request_headers")
            reply.mode_override.CopyFrom(REQUEST_BODY_AND_RESPONSE_HEADERS)
            return reply, None
        return await self._with_body(st, b"", True, "request_headers", ask)

    async def _request_body(self, st: _Stream, msg: pb.HttpBody, ask: AskForTime) -> Reply:
        return await self._with_body(st, msg.body, msg.end_of_stream, "request_body", ask)

    async def _with_body(
        self, st: _Stream, data: bytes, complete: bool, kind: str, ask: AskForTime
    ) -> Reply:
        """Decide once the body is known (empty when the request has none), and attach the
        request's weight for Envoy's ratelimit filter when the rule has `hits_from`."""
        assert st.rule is not None
        rule = st.rule
        body = Body(data, complete, rule.max_json_bytes)
        reply, job = await self._decide(st, body, kind, ask)
        if rule.hits_from is not None:
            weight, source = body_weight(body, rule.hits_from)
            self.metrics.weights.labels(rule.api, source).inc()
            _set_weight(reply, weight)
        return reply, job

    async def _decide(self, st: _Stream, body: Body, kind: str, ask: AskForTime) -> Reply:
        assert st.rule is not None
        if st.pending_bypass is not None:
            return self._bypass(st, st.pending_bypass, kind)
        if not body.complete:
            return self._bypass(st, "partial_request_body", kind)
        members: tuple[bytes | None, ...] = ()
        if st.rule.key.fields:
            members, failure = key_members(body, st.rule.key.fields)
            if failure is not None:
                return self._bypass(st, failure, kind)
        return await self._lookup(st, body.data, members, kind, ask)

    async def _lookup(
        self, st: _Stream, body: bytes, members: tuple[bytes | None, ...], kind: str,
        ask: AskForTime,
    ) -> Reply:
        assert st.rule is not None and st.headers is not None
        rule = st.rule
        rk = self.cache.request_key(rule, st.method, st.headers, body, members)
        if st.skip_read:
            self.metrics.bypasses.labels("request_no_cache").inc()
        result = await self.cache.lookup(rk, on_wait=ask, skip_read=st.skip_read)
        if result.entry is not None:
            st.phase = "done"
            self.metrics.hits.labels(rule.api).inc()
            return self._hit(result.entry), self.cache.refresh_job(rule, result.keys)
        if result.error is not None:
            return self._bypass(st, result.error, kind)
        self.metrics.misses.labels(rule.api).inc()
        st.rk, st.fill, st.phase = rk, result.fill, "fill"
        reply = _empty(kind)
        if kind == "request_headers":
            reply.mode_override.CopyFrom(RESPONSE_HEADERS)
        return reply, None

    def _hit(self, entry: Entry) -> pb.ProcessingResponse:
        reply = pb.ProcessingResponse()
        ir = reply.immediate_response
        ir.status.code = entry.status
        seen: set[str] = set()
        for name, value in entry.headers:
            _set_header(ir.headers, name, value, _APPEND if name in seen else _OVERWRITE)
            seen.add(name)
        _set_header(ir.headers, "x-cache", b"HIT", _OVERWRITE)
        _set_header(ir.headers, "age", str(self.cache.age(entry)).encode(), _OVERWRITE)
        ir.body = entry.body
        ir.details = DETAILS
        return reply

    # ------------------------------------------------------------------ response side

    def _response_headers(self, st: _Stream, msg: pb.HttpHeaders) -> Reply:
        assert st.rule is not None
        headers = Headers.from_proto(msg.headers)
        problem = header_problem(headers)
        status = status_code(headers) or 0
        if problem is not None:
            log.debug("response headers not cacheable: %s", problem)
            reason: str | None = "malformed_header"
        else:
            reason = never_store_reason(st.rule, status, headers)
        st.phase = "done"
        if reason is None and not msg.end_of_stream and not headers.has("content-length") \
                and not st.rule.buffer_unknown_length:
            reason = "unknown_length"
        if reason is not None:
            self.metrics.bypasses.labels(reason).inc()
            self._release(st)
            return _marked("response_headers", b"BYPASS"), None
        reply = _marked("response_headers", b"MISS")
        st.status = status
        st.stored_headers = storable_headers(headers)
        st.vary = frozenset(vary_names(headers) or ())
        if msg.end_of_stream:  # no body will follow (e.g. 204): store what we have
            return reply, self._save(st, b"")
        # Known length within max_entry_bytes (checked above), or the rule accepts the risk.
        st.phase = "response_body"
        reply.mode_override.CopyFrom(RESPONSE_BODY)
        return reply, None

    def _response_body(self, st: _Stream, msg: pb.HttpBody) -> Reply:
        assert st.rule is not None
        st.phase = "done"
        reason = None
        if not msg.end_of_stream:
            reason = "partial_body"
        elif len(msg.body) > st.rule.max_entry_bytes:
            reason = "too_large"
        if reason is not None:
            # BUFFERED: Envoy still holds the headers, so this replaces the MISS sent earlier.
            self.metrics.bypasses.labels(reason).inc()
            self._release(st)
            return _marked("response_body", b"BYPASS"), None
        return _empty("response_body"), self._save(st, msg.body)

    def _save(self, st: _Stream, body: bytes) -> WriteJob:
        """The store job; `process` hands it (and the fill with it) to the writer."""
        assert st.rk is not None
        reply = StoredResponse(st.status, st.stored_headers, body, st.vary)
        return self.cache.store_job(st.rk, reply, st.fill)

    def _release(self, st: _Stream) -> None:
        if st.fill is not None:
            st.fill.release()
            st.fill = None

    def _bypass(self, st: _Stream, reason: str, kind: str) -> Reply:
        """Go upstream uncached; ask for the response headers to mark them `x-cache: BYPASS`.

        After request_body the response headers are already asked for; a mode_override would
        be ignored there (Envoy honours it only in replies to header messages).
        """
        self.metrics.bypasses.labels(reason).inc()
        st.phase = "bypass"
        reply = _empty(kind)
        if kind == "request_headers":
            reply.mode_override.CopyFrom(RESPONSE_HEADERS)
        return reply, None


def _set_weight(reply: pb.ProcessingResponse, weight: int) -> None:
    """`rls:hits` dynamic metadata, read by Envoy's ratelimit filter after ext_proc as
    `hits_addend: {format: "%DYNAMIC_METADATA(rls:hits)%"}`. Envoy keeps it only when the
    ext_proc filter lists the namespace in `metadata_options.receiving_namespaces.untyped`.
    Sent as a decimal string, exact at any size (a whole Struct number worked as well on
    Envoy 1.40; the formatter's output must be a non-negative integer or Envoy drops the
    descriptor)."""
    namespace = reply.dynamic_metadata.fields[WEIGHT_NAMESPACE].struct_value
    namespace.fields[WEIGHT_KEY].string_value = str(weight)


def _marked(kind: str, value: bytes) -> pb.ProcessingResponse:
    """The empty reply for a response message, setting `x-cache: value`."""
    reply = _empty(kind)
    mutation = getattr(reply, kind).response.header_mutation
    _set_header(mutation, "x-cache", value, _OVERWRITE)
    return reply


def _empty(kind: str | None) -> pb.ProcessingResponse:
    """The "continue, change nothing" reply for a message of this kind."""
    reply = pb.ProcessingResponse()
    if kind in ("request_headers", "response_headers", "request_body", "response_body"):
        getattr(reply, kind).response.SetInParent()
    elif kind in ("request_trailers", "response_trailers"):
        getattr(reply, kind).SetInParent()
    return reply


def _set_header(mutation: Any, name: str, value: bytes, action: int) -> None:
    """Header values must go in `raw_value`: Envoy sends an empty header for `value` (e2e)."""
    option = mutation.set_headers.add()
    option.header.key = name
    option.header.raw_value = value
    option.append_action = action


def _attributes(request: pb.ProcessingRequest) -> dict[str, Any]:
    """The request attributes Envoy evaluated, as plain strings, numbers and booleans."""
    if ATTRIBUTES not in request.attributes:
        return {}
    out: dict[str, Any] = {}
    for name, value in request.attributes[ATTRIBUTES].fields.items():
        which = value.WhichOneof("kind")
        if which == "string_value":
            out[name] = value.string_value
        elif which == "number_value":
            number = value.number_value
            out[name] = int(number) if number.is_integer() else number
        elif which == "bool_value":
            out[name] = "true" if value.bool_value else "false"
    return out


def warn_if_open(addr: str, token: bool) -> None:
    """ext_proc calls write entries served to every user: say so when anyone may make them."""
    if token or addr.startswith(("unix:", "unix-abstract:")) or is_loopback(addr):
        return
    log.warning(
        "ext_proc (response cache) listens on %s, off loopback, and RLS_GRPC_TOKEN is not set: "
        "anyone who reaches it can write cache entries that are served to your users "
        "(docs/cache.md, \"Who can write to the cache\")", addr,
    )


def build_cache(
    cache_config_path: str,
    store_url: str | None = None,
    registry: CollectorRegistry | None = None,
    *,
    config: CacheConfig | None = None,
) -> tuple[ExtProcService, ResponseCache]:
    """Servicer and cache from a rules file (raises ConfigError) and a store URL.

    The store is `store_url` if given, else the file's `store:`, else in-process memory (one
    process only, an LRU within `memory_max_bytes`: fine for a demo, not for several replicas or
    workers). Connecting is lazy:
    a store that is down at start only means uncached requests until it answers.
    """
    if config is None:
        config = load_cache_config(cache_config_path)
    url = store_url or config.store
    if not url:
        log.warning("no cache store URL given: entries live in this process's memory only")
    store = create_store(
        url, timeout_ms=config.store_timeout_ms, memory_max_bytes=config.memory_max_bytes
    )
    cache = ResponseCache(config, store, CacheMetrics(registry))
    return ExtProcService(cache), cache
