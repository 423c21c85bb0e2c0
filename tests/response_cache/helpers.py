"""Builders for ext_proc messages as Envoy 1.40 sends them, and a fake grpc.aio context."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from rls.response_cache.cache import ResponseCache
from rls.response_cache.config import API_ATTRIBUTE, CacheConfig, parse_cache_config
from rls.response_cache.metrics import CacheMetrics
from rls.response_cache.store import GuardedStore, MemoryCacheStore
from rls.services.extproc import ATTRIBUTES, ExtProcService

RULES = """
coalesce_wait_ms: 0
version_cache_ms: 0
rules:
- api: translate
  methods: [POST]
  key: {extra_key_header: x-cache-key, body: true}
  ttl: 7d
  max_entry_bytes: 1000
- api: items
  methods: [GET]
  key: {query: true}
  vary: [accept-language]
  ttl: 60
  unknown_length: buffer
  max_entry_bytes: 1000
"""


def config(text: str = RULES) -> CacheConfig:
    return parse_cache_config("test.yaml", text)


def make_service(
    text: str = RULES, store: GuardedStore | None = None, clock: Any = None,
    metrics: CacheMetrics | None = None,
) -> tuple[ExtProcService, ResponseCache]:
    kwargs = {"clock": clock} if clock is not None else {}
    cache = ResponseCache(
        config(text), store or MemoryCacheStore(timeout_ms=200), metrics or CacheMetrics(),
        **kwargs,
    )
    return ExtProcService(cache), cache


def _header_map(target: Any, headers: list[tuple[str, str | bytes]]) -> None:
    for name, value in headers:
        h = target.headers.add()
        h.key = name
        h.raw_value = value.encode() if isinstance(value, str) else value  # never `value`


def request_headers(
    method: str = "POST",
    path: str = "/translate",
    headers: list[tuple[str, str | bytes]] | None = None,
    eos: bool | None = None,
    api: str | None = "translate",
) -> pb.ProcessingRequest:
    req = pb.ProcessingRequest()
    base = [(":authority", "gw"), (":path", path), (":method", method), (":scheme", "http")]
    _header_map(req.request_headers.headers, base + (headers or []))
    req.request_headers.end_of_stream = (method == "GET") if eos is None else eos
    if api is not None:
        req.attributes[ATTRIBUTES].fields[API_ATTRIBUTE].string_value = api
    return req


def request_body(body: bytes, eos: bool = True) -> pb.ProcessingRequest:
    req = pb.ProcessingRequest()
    req.request_body.body = body
    req.request_body.end_of_stream = eos
    return req


def response_headers(
    status: int = 200,
    headers: list[tuple[str, str | bytes]] | None = None,
    eos: bool = False,
    length: int | None = None,
) -> pb.ProcessingRequest:
    req = pb.ProcessingRequest()
    base: list[tuple[str, str | bytes]] = [(":status", str(status)), ("content-type", "text/plain")]
    if length is not None:
        base.append(("content-length", str(length)))
    _header_map(req.response_headers.headers, base + (headers or []))
    req.response_headers.end_of_stream = eos
    return req


def response_body(body: bytes, eos: bool = True) -> pb.ProcessingRequest:
    req = pb.ProcessingRequest()
    req.response_body.body = body
    req.response_body.end_of_stream = eos
    return req


class FakeContext:
    """Feeds messages to the servicer and records what it writes, in order.

    `gate` (optional) is awaited before each read after the first, so a test can interleave
    two streams; `events` is shared with a recording store to check reply-before-store order.
    """

    def __init__(self, messages: list[pb.ProcessingRequest], events: list[str] | None = None,
                 cancel_after: int | None = None) -> None:
        self.inbox = list(messages)
        self.sent: list[pb.ProcessingResponse] = []
        self.events = events if events is not None else []
        self.cancel_after = cancel_after
        self.reads = 0
        self.gates: dict[int, asyncio.Event] = {}

    async def read(self) -> Any:
        if self.reads in self.gates:
            await self.gates[self.reads].wait()
        if self.cancel_after is not None and self.reads >= self.cancel_after:
            raise asyncio.CancelledError
        self.reads += 1
        if self.inbox:
            return self.inbox.pop(0)
        return grpc.aio.EOF

    async def write(self, message: pb.ProcessingResponse) -> None:
        self.sent.append(message)
        self.events.append("reply:" + (message.WhichOneof("response") or "other"))

    def replies(self) -> list[pb.ProcessingResponse]:
        """Replies proper (override_message_timeout messages are not replies)."""
        return [m for m in self.sent if not m.HasField("override_message_timeout")]


async def run(service: ExtProcService, messages: list[pb.ProcessingRequest],
              **kwargs: Any) -> FakeContext:
    """One stream through the servicer, then wait for its background stores."""
    ctx = FakeContext(messages, **kwargs)
    await service.process(iter(()), ctx)  # type: ignore[arg-type]
    await drain(service.cache)
    return ctx


async def drain(cache: ResponseCache) -> None:
    """Wait for the writer to run every queued store and refresh."""
    await asyncio.wait_for(cache.writer.idle(), 10)


def set_headers(mutation: Any) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    for option in mutation.set_headers:
        assert option.header.value == "", "header values must go in raw_value"
        out.setdefault(option.header.key, []).append(option.header.raw_value)
    return out
