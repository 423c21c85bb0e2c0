"""The ExtProc servicer against a fake stream (memory store): message flow, replies, stores."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from rls.response_cache.store import MemoryCacheStore, StoreDown
from rls.services.extproc import (
    DETAILS,
    REQUEST_BODY_AND_RESPONSE_HEADERS,
    RESPONSE_BODY,
    RESPONSE_HEADERS,
)

from .helpers import (
    FakeContext,
    drain,
    make_service,
    request_body,
    request_headers,
    response_body,
    response_headers,
    run,
    set_headers,
)

BODY = b'{"q": "hello"}'
KEY = [("x-cache-key", "k1")]


def miss_messages(body: bytes = BODY, key: list = KEY, resp: bytes = b"bonjour",
                  extra: list | None = None, status: int = 200) -> list:
    return [
        request_headers(headers=key),
        request_body(body),
        response_headers(status, extra, length=len(resp)),
        response_body(resp),
    ]


def hit_messages(body: bytes = BODY, key: list = KEY) -> list:
    return [request_headers(headers=key), request_body(body)]


def stored(cache) -> list[str]:
    return [k for k in cache.store.data if ":e:" in k]


async def test_miss_then_hit() -> None:
    service, cache = make_service(clock=lambda: 1_000_000.0)
    ctx = await run(service, miss_messages(extra=[("x-backend", "9002")]))
    r_headers, r_body, r_resp_headers, r_resp_body = ctx.replies()
    assert r_headers.mode_override == REQUEST_BODY_AND_RESPONSE_HEADERS
    assert not r_body.HasField("mode_override")
    assert set_headers(r_resp_headers.response_headers.response.header_mutation) == {
        "x-cache": [b"MISS"]
    }
    assert r_resp_headers.mode_override == RESPONSE_BODY
    assert r_resp_body.HasField("response_body")
    assert len(stored(cache)) == 1
    assert cache.metrics.misses.labels("translate")._value.get() == 1

    cache.clock = lambda: 1_000_042.9
    ctx = await run(service, hit_messages())
    ask_body, reply = ctx.replies()  # answered at the request body: nothing else follows
    assert ask_body.mode_override == REQUEST_BODY_AND_RESPONSE_HEADERS
    ir = reply.immediate_response
    assert ir.status.code == 200
    assert ir.body == b"bonjour"
    assert ir.details == DETAILS
    headers = set_headers(ir.headers)
    assert headers["x-cache"] == [b"HIT"]
    assert headers["age"] == [b"42"]
    assert headers["x-backend"] == [b"9002"]
    assert headers["content-type"] == [b"text/plain"]
    assert "content-length" not in headers
    assert cache.metrics.hits.labels("translate")._value.get() == 1


async def test_get_without_body_asks_only_for_response_headers() -> None:
    service, cache = make_service()
    ctx = await run(service, [
        request_headers("GET", "/items?page=1", api="items"),
        response_headers(length=4),
        response_body(b"page"),
    ])
    first = ctx.replies()[0]
    assert first.mode_override == RESPONSE_HEADERS
    assert len(stored(cache)) == 1


async def test_reply_is_written_before_the_store() -> None:
    events: list[str] = []

    class Recording(MemoryCacheStore):
        async def _set(self, key: str, value: bytes, ttl: int) -> None:
            events.append("store")
            await super()._set(key, value, ttl)

    service, _cache = make_service(store=Recording())
    await run(service, miss_messages(), events=events)
    assert events[-2:] == ["reply:response_body", "store"]


def x_cache(reply: pb.ProcessingResponse) -> list[bytes] | None:
    kind = reply.WhichOneof("response")
    return set_headers(getattr(reply, kind).response.header_mutation).get("x-cache")


async def test_uncacheable_request_is_marked_bypass() -> None:
    service, cache = make_service()
    ctx = await run(service, [request_headers(api="other", eos=True), response_headers(length=2)])
    first, second = ctx.sent
    assert first.HasField("request_headers")
    assert first.mode_override == RESPONSE_HEADERS  # only to mark the response
    assert not first.request_headers.response.HasField("header_mutation")
    assert x_cache(second) == [b"BYPASS"]
    assert not second.HasField("mode_override")
    assert cache.metrics.bypasses.labels("no_rule")._value.get() == 1

    ctx = await run(service, [request_headers("GET", api="translate"), response_headers()])
    assert ctx.sent[0].mode_override == RESPONSE_HEADERS
    assert x_cache(ctx.sent[1]) == [b"BYPASS"]
    assert cache.metrics.bypasses.labels("method")._value.get() == 1
    assert cache.metrics.misses.labels("translate")._value.get() == 0


async def test_header_rule_and_attribute_absent() -> None:
    text = """
rules:
- api: search
  match: {header: x-cacheable, value: "yes"}
  methods: [GET]
"""
    service, cache = make_service(text)
    await run(service, [request_headers("GET", "/s", [("x-cacheable", "yes")], api=None)])
    assert cache.metrics.misses.labels("search")._value.get() == 1
    await run(service, [request_headers("GET", "/s", [("x-cacheable", "no")], api=None)])
    assert cache.metrics.misses.labels("search")._value.get() == 1
    assert cache.metrics.bypasses.labels("no_rule")._value.get() == 1


@pytest.mark.parametrize(
    ("status", "extra", "reason"),
    [
        (500, [], "status"),
        (404, [], "status"),
        (201, [], "status"),
        (200, [("cache-control", "no-store")], "no_store"),
        (200, [("cache-control", "max-age=60, private")], "private"),
        (200, [("cache-control", "no-cache")], "no_cache"),
        (200, [("set-cookie", "a=b")], "set_cookie"),
        (200, [("vary", "x-other")], "vary"),
        (200, [("vary", "*")], "vary"),
    ],
)
async def test_never_stored_by_headers(status: int, extra: list, reason: str) -> None:
    service, cache = make_service()
    messages = miss_messages(extra=extra, status=status)[:3]  # Envoy sends no body after NONE
    ctx = await run(service, messages)
    reply = ctx.replies()[2]
    assert set_headers(reply.response_headers.response.header_mutation) == {
        "x-cache": [b"BYPASS"]
    }
    assert not reply.HasField("mode_override")  # the body stays NONE: never buffered
    assert stored(cache) == []
    assert cache.metrics.bypasses.labels(reason)._value.get() == 1
    assert cache.fills == {}


async def test_content_length_over_max_entry_is_never_buffered() -> None:
    service, cache = make_service()
    ctx = await run(service, [
        request_headers(headers=KEY), request_body(BODY), response_headers(length=5000)
    ])
    assert not ctx.replies()[2].HasField("mode_override")
    assert x_cache(ctx.replies()[2]) == [b"BYPASS"]
    assert cache.metrics.bypasses.labels("too_large")._value.get() == 1


async def test_unknown_length_skipped_unless_the_rule_buffers() -> None:
    service, cache = make_service()
    ctx = await run(service, [request_headers(headers=KEY), request_body(BODY), response_headers()])
    assert not ctx.replies()[2].HasField("mode_override")
    assert cache.metrics.bypasses.labels("unknown_length")._value.get() == 1

    ctx = await run(service, [
        request_headers("GET", "/items", api="items"), response_headers(), response_body(b"ok")
    ])
    assert ctx.replies()[1].mode_override == RESPONSE_BODY
    assert len(stored(cache)) == 1


@pytest.mark.parametrize(
    ("body", "eos", "reason"), [(b"x" * 1001, True, "too_large"), (b"part", False, "partial_body")]
)
async def test_never_stored_by_body(body: bytes, eos: bool, reason: str) -> None:
    service, cache = make_service()
    ctx = await run(service, [
        request_headers("GET", "/items", api="items"), response_headers(), response_body(body, eos)
    ])
    assert ctx.replies()[2].HasField("response_body")
    assert x_cache(ctx.replies()[1]) == [b"MISS"]
    assert x_cache(ctx.replies()[2]) == [b"BYPASS"]  # replaces MISS: headers still held
    assert stored(cache) == []
    assert cache.metrics.bypasses.labels(reason)._value.get() == 1
    assert cache.metrics.cacheable_misses.labels("items")._value.get() == 0
    assert cache.fills == {}


async def test_partial_request_body_bypasses() -> None:
    service, cache = make_service()
    ctx = await run(service, [
        request_headers(headers=KEY), request_body(b"half", eos=False), response_headers(length=2)
    ])
    assert [r.WhichOneof("response") for r in ctx.replies()] == [
        "request_headers", "request_body", "response_headers"
    ]
    assert x_cache(ctx.replies()[2]) == [b"BYPASS"]
    assert cache.metrics.bypasses.labels("partial_request_body")._value.get() == 1


async def test_stored_headers_are_stripped() -> None:
    service, _cache = make_service()
    hop = [
        ("x-envoy-upstream-service-time", "3"), ("connection", "close, x-per-conn"),
        ("x-per-conn", "1"), ("keep-alive", "timeout=5"), ("transfer-encoding", "chunked"),
        ("te", "trailers"), ("trailer", "x"), ("upgrade", "h2c"), ("proxy-authenticate", "x"),
        ("date", "Sun, 22 Nov 2026 15:00:00 GMT"), ("x-cache", "HIT"), ("age", "9"),
        ("x-ratelimit-remaining", "3"), ("link", "</a>"), ("link", "</b>"),
    ]
    await run(service, miss_messages(extra=hop))
    ctx = await run(service, hit_messages())
    hit = ctx.replies()[-1].immediate_response
    headers = set_headers(hit.headers)
    assert set(headers) == {"content-type", "link", "x-cache", "age"}
    assert headers["link"] == [b"</a>", b"</b>"]
    assert headers["x-cache"] == [b"HIT"]
    actions = [o.append_action for o in hit.headers.set_headers if o.header.key == "link"]
    assert actions[0] != actions[1]  # first overwrites, repeats append


async def test_key_parts() -> None:
    service, _cache = make_service()
    await run(service, miss_messages())
    for messages in (
        hit_messages(body=b"other"),
        hit_messages(key=[("x-cache-key", "k2")]),
        hit_messages(key=[]),
        [request_headers(path="/translate/v2", headers=KEY), request_body(BODY)],
    ):
        ctx = await run(service, messages)
        assert not ctx.replies()[-1].HasField("immediate_response")
    assert (await run(service, hit_messages())).replies()[-1].HasField("immediate_response")


async def test_ttl_refreshed_on_hit() -> None:
    service, cache = make_service()
    await run(service, miss_messages())
    [key] = stored(cache)
    value, _ = cache.store.data[key]
    cache.store.data[key] = (value, time.monotonic() + 5)
    assert cache.store.ttl(key) < 6
    await run(service, hit_messages())
    assert cache.store.ttl(key) > 7 * 86400 - 5


async def test_purge_is_a_new_namespace() -> None:
    service, cache = make_service()
    await run(service, miss_messages())
    await cache.purge("translate")
    ctx = await run(service, hit_messages())
    assert not ctx.replies()[-1].HasField("immediate_response")
    with pytest.raises(KeyError):
        await cache.purge("nope")


async def test_vary_variants() -> None:
    service, cache = make_service()

    def get(lang: str) -> list:
        return [request_headers("GET", "/items?p=1", [("accept-language", lang)], api="items")]

    vary = [("vary", "Accept-Language")]
    await run(service, [*get("en"), response_headers(headers=vary, length=2), response_body(b"en")])
    assert len(stored(cache)) == 2  # pointer + entry
    hit = (await run(service, get("en"))).replies()[0]
    assert hit.immediate_response.body == b"en"
    miss = (await run(service, get("de"))).replies()[0]
    assert miss.mode_override == RESPONSE_HEADERS


async def test_request_cache_control() -> None:
    service, cache = make_service()
    await run(service, miss_messages())
    no_store = [request_headers(headers=[*KEY, ("cache-control", "no-store")], eos=True)]
    assert (await run(service, no_store)).sent[0].mode_override == RESPONSE_HEADERS
    assert cache.metrics.bypasses.labels("request_no_store")._value.get() == 1
    # no-cache: not served from the cache, but the fresh response replaces the entry
    fresh = miss_messages(resp=b"fresh")
    fresh[0] = request_headers(headers=[*KEY, ("cache-control", "no-cache")])
    ctx = await run(service, fresh)
    assert not any(r.HasField("immediate_response") for r in ctx.replies())
    hit = (await run(service, hit_messages())).replies()[-1]
    assert hit.immediate_response.body == b"fresh"


async def test_204_without_body_is_stored_at_headers() -> None:
    text = "rules:\n- api: items\n  methods: [GET]\n  statuses: [200, 204]\n"
    service, _cache = make_service(text)
    messages = [request_headers("GET", "/items", api="items"), response_headers(204, eos=True)]
    await run(service, messages)
    hit = (await run(service, messages[:1])).replies()[0]
    assert hit.immediate_response.status.code == 204


async def test_unexpected_messages_get_matching_empty_replies() -> None:
    service, _ = make_service()
    local_reply = response_headers(401)  # a 401 from an earlier filter, no request_headers
    trailers = pb.ProcessingRequest()
    trailers.response_trailers.SetInParent()
    ctx = await run(service, [local_reply, trailers])
    assert [r.WhichOneof("response") for r in ctx.sent] == ["response_headers", "response_trailers"]
    assert not ctx.sent[0].response_headers.response.HasField("header_mutation")


class FailingStore(MemoryCacheStore):
    async def _get(self, key: str) -> bytes | None:
        raise OSError("connection refused")


class SlowStore(MemoryCacheStore):
    async def _get(self, key: str) -> bytes | None:
        await asyncio.sleep(1)
        return None


@pytest.mark.parametrize("store", [FailingStore, SlowStore])
async def test_store_failure_means_uncached(store: type) -> None:
    service, cache = make_service(store=store(timeout_ms=20))
    ctx = await run(service, [request_headers("GET", "/items", api="items"), response_headers()])
    reply, marked = ctx.sent
    assert reply.HasField("request_headers")
    assert reply.mode_override == RESPONSE_HEADERS  # proceed upstream; only to mark it
    assert x_cache(marked) == [b"BYPASS"]
    assert cache.metrics.errors.labels("version")._value.get() == 1
    assert cache.metrics.bypasses.labels("store_error")._value.get() == 1


async def test_store_marked_down_after_failures_and_a_failed_probe() -> None:
    """A connection error is evidence: the store's breaker (the counter stores' one) probes it
    at once and at the latest opens on the third error in a row; then lookups are not even
    tried (store_down) while the probe keeps failing."""
    store = FailingStore(timeout_ms=20)
    service, cache = make_service(store=store)
    for _ in range(5):
        await run(service, [request_headers("GET", "/items", api="items")])
        await asyncio.sleep(0)  # the probe's turn
    errors = cache.metrics.errors.labels("version")._value.get()
    down = cache.metrics.bypasses.labels("store_down")._value.get()
    assert 1 <= errors <= 3 and errors + down == 5
    assert store.down
    with pytest.raises(StoreDown):
        await cache.store.get("x")
    await store.close()


COALESCE = """
coalesce_wait_ms: 2000
rules:
- api: items
  methods: [GET]
"""


async def fill_with_a_waiter(
    service: Any, cache: Any, second: FakeContext
) -> tuple[FakeContext, asyncio.Task[None], asyncio.Task[None]]:
    """A miss whose fill is in progress (its response held at `first.gates[1]`) and an
    identical request, `second`, waiting for it: (first, the fill's task, the waiter's)."""
    first = FakeContext([
        request_headers("GET", "/items", api="items"), response_headers(length=4),
        response_body(b"page"),
    ])
    first.gates[1] = asyncio.Event()  # hold the response until the second request waits
    task = asyncio.create_task(service.process(iter(()), first))
    while not cache.fills:
        await asyncio.sleep(0)
    waiter = asyncio.create_task(service.process(iter(()), second))
    while not second.sent:
        await asyncio.sleep(0)
    return first, task, waiter


async def test_identical_miss_waits_for_the_fill_in_progress() -> None:
    service, cache = make_service(COALESCE)
    second = FakeContext([request_headers("GET", "/items", api="items")])
    first, task, waiter = await fill_with_a_waiter(service, cache, second)
    # first message on the waiting stream asks Envoy for time (max_message_timeout permitting)
    # the wait, plus two store calls (200 ms each here) and 50 ms for the lookup after it
    assert second.sent[0].override_message_timeout.ToMilliseconds() == 2000 + 2 * 200 + 50
    first.gates[1].set()
    await asyncio.wait_for(asyncio.gather(task, waiter), 5)
    await drain(cache)
    assert second.replies()[0].immediate_response.body == b"page"
    assert cache.metrics.coalesced.labels("hit")._value.get() == 1


async def test_coalescing_wait_is_bounded() -> None:
    service, cache = make_service(COALESCE.replace("2000", "50"))
    first = FakeContext([request_headers("GET", "/items", api="items"), response_headers()])
    first.gates[1] = asyncio.Event()  # the first response never comes during the test
    task = asyncio.create_task(service.process(iter(()), first))  # type: ignore[arg-type]
    while not cache.fills:
        await asyncio.sleep(0)
    second = await asyncio.wait_for(run(service, [request_headers("GET", "/items", api="items")]),
                                    2)
    assert second.replies()[0].mode_override == RESPONSE_HEADERS  # went upstream itself
    assert cache.metrics.coalesced.labels("timeout")._value.get() == 1
    first.gates[1].set()
    await task


class StallsAfterTheFill(MemoryCacheStore):
    """Writes take 60 ms; once an entry is written, every read stalls past its deadline."""

    written = False

    async def _set(self, key: str, value: bytes, ttl: int) -> None:
        await asyncio.sleep(0.06)
        await super()._set(key, value, ttl)
        self.written = True

    async def _get(self, key: str) -> bytes | None:
        if self.written:
            await asyncio.sleep(1)
        return await super()._get(key)


class TimedContext(FakeContext):
    def __init__(self, messages: list) -> None:
        super().__init__(messages)
        self.times: list[float] = []

    async def write(self, message) -> None:
        self.times.append(time.monotonic())
        await super().write(message)


async def test_a_coalesced_miss_answers_within_the_time_it_asked_envoy_for() -> None:
    """The fill ends during the wait, then the read after it meets a stalled store: that read
    (a Vary pointer and its entry: two store calls of up to store_timeout_ms) must fit in the
    time asked of Envoy, or Envoy gives up on rls first (message_timeout)."""
    rules = "store_timeout_ms: 200\n" + COALESCE.replace("2000", "100")
    service, cache = make_service(rules, store=StallsAfterTheFill(timeout_ms=200))
    second = TimedContext([request_headers("GET", "/items", api="items")])
    first, task, waiter = await fill_with_a_waiter(service, cache, second)
    first.gates[1].set()
    await asyncio.wait_for(asyncio.gather(task, waiter), 5)
    asked, reply = second.sent[0], second.sent[1]
    assert asked.HasField("override_message_timeout")
    assert reply.HasField("request_headers")  # answered uncached: the read timed out
    assert cache.metrics.errors.labels("get")._value.get() == 1
    held = second.times[1] - second.times[0]
    assert held <= asked.override_message_timeout.ToMilliseconds() / 1000, held
    await drain(cache)


async def test_cancelled_stream_releases_its_fill() -> None:
    service, cache = make_service(COALESCE)
    ctx = FakeContext([request_headers("GET", "/items", api="items")], cancel_after=1)
    with pytest.raises(asyncio.CancelledError):
        await service.process(iter(()), ctx)  # type: ignore[arg-type]
    assert cache.fills == {}
    assert cache.metrics.fills._value.get() == 0


class EndedAtLastReply(FakeContext):
    """Envoy ends the stream on the last reply: grpc.aio cancels the handler in its write."""

    def __init__(self, messages: list, last: str) -> None:
        super().__init__(messages)
        self.last = last

    async def write(self, message) -> None:
        await super().write(message)
        if message.WhichOneof("response") == self.last:
            raise asyncio.CancelledError


async def test_store_survives_the_stream_ending_at_the_last_reply() -> None:
    service, cache = make_service(COALESCE)
    ctx = EndedAtLastReply([
        request_headers("GET", "/items", api="items"), response_headers(length=2),
        response_body(b"ok")], "response_body")
    with pytest.raises(asyncio.CancelledError):
        await service.process(iter(()), ctx)  # type: ignore[arg-type]
    await drain(cache)
    assert len(stored(cache)) == 1
    assert cache.fills == {}
    m = cache.metrics
    assert m.cacheable_misses.labels("items")._value.get() == 1
    assert m.stores.labels("items")._value.get() == 1


async def test_refresh_survives_the_stream_ending_at_the_hit() -> None:
    service, cache = make_service()
    await run(service, miss_messages())
    [key] = stored(cache)
    value, _ = cache.store.data[key]
    cache.store.data[key] = (value, time.monotonic() + 5)
    ctx = EndedAtLastReply(hit_messages(), "immediate_response")
    with pytest.raises(asyncio.CancelledError):
        await service.process(iter(()), ctx)  # type: ignore[arg-type]
    await drain(cache)
    assert cache.store.ttl(key) > 7 * 86400 - 5
    assert cache.metrics.hits.labels("translate")._value.get() == 1
    assert cache.metrics.refreshes.labels("translate")._value.get() == 1


async def test_failed_final_write_still_stores_and_releases_the_fill() -> None:
    service, cache = make_service(COALESCE)

    class Broken(FakeContext):
        async def write(self, message) -> None:
            if message.HasField("response_body"):
                raise ConnectionError("stream gone")
            await super().write(message)

    ctx = Broken([request_headers("GET", "/items", api="items"), response_headers(length=2),
                  response_body(b"ok")])
    await service.process(iter(()), ctx)  # type: ignore[arg-type]
    await drain(cache)
    assert cache.fills == {}
    assert len(stored(cache)) == 1  # handed to the writer before the write failed


class BlockingStore(MemoryCacheStore):
    """Writes wait for `gate`; reads are normal."""

    def __init__(self) -> None:
        super().__init__(timeout_ms=60_000)
        self.gate = asyncio.Event()
        self.writing = asyncio.Event()

    async def _set(self, key: str, value: bytes, ttl: int) -> None:
        self.writing.set()
        await self.gate.wait()
        await super()._set(key, value, ttl)


QUEUE_OF_ONE = """
coalesce_wait_ms: 0
writer_workers: 1
write_queue_size: 1
rules:
- api: items
  methods: [GET]
  key: {query: true}
"""


QUEUE_OF_NINE = QUEUE_OF_ONE.replace("write_queue_size: 1", "write_queue_size: 9")


def miss(page: int) -> list:
    return [request_headers("GET", f"/items?p={page}", api="items"), response_headers(length=2),
            response_body(b"ok")]


async def test_full_writer_queue_drops_and_counts() -> None:
    store = BlockingStore()
    service, cache = make_service(QUEUE_OF_ONE, store=store)
    for page in range(3):  # 1 running (blocked), 1 queued, 1 dropped
        ctx = FakeContext(miss(page))
        await service.process(iter(()), ctx)  # type: ignore[arg-type]
        assert ctx.replies()[-1].HasField("response_body")  # the reply never waits
        if page == 0:
            await store.writing.wait()
    m = cache.metrics
    assert m.writes_dropped.labels("store", "items")._value.get() == 1
    assert m.write_queue._value.get() == 2
    assert len(cache.fills) == 2  # the dropped job's fill was released at once
    store.gate.set()
    await drain(cache)
    assert cache.fills == {}
    assert m.write_queue._value.get() == 0
    assert m.cacheable_misses.labels("items")._value.get() == 3
    assert m.stores.labels("items")._value.get() == 2
    assert m.store_failures.labels("items")._value.get() == 0
    assert len(stored(cache)) == 2


async def test_close_drains_queued_writes() -> None:
    store = BlockingStore()
    service, cache = make_service(QUEUE_OF_NINE, store=store)
    for page in range(3):
        await service.process(iter(()), FakeContext(miss(page)))  # type: ignore[arg-type]
    await store.writing.wait()
    closing = asyncio.create_task(cache.close(timeout=10))
    store.gate.set()
    await asyncio.wait_for(closing, 10)
    assert len(stored(cache)) == 3
    assert cache.metrics.stores.labels("items")._value.get() == 3
    assert cache.metrics.write_queue._value.get() == 0
    # after close, a late write is dropped and counted, never left dangling
    await service.process(iter(()), FakeContext(miss(9)))  # type: ignore[arg-type]
    assert cache.metrics.writes_dropped.labels("store", "items")._value.get() == 1


async def test_close_is_bounded_and_counts_what_it_abandons() -> None:
    store = BlockingStore()  # the gate never opens
    service, cache = make_service(QUEUE_OF_NINE, store=store)
    for page in range(3):
        await service.process(iter(()), FakeContext(miss(page)))  # type: ignore[arg-type]
    await store.writing.wait()
    await asyncio.wait_for(cache.close(timeout=0.05), 5)
    m = cache.metrics
    assert m.writes_dropped.labels("store", "items")._value.get() == 3  # 1 running + 2 queued
    assert m.cacheable_misses.labels("items")._value.get() == 3
    assert m.write_queue._value.get() == 0
    assert cache.fills == {}


async def test_write_failures_are_counted_apart_from_stores() -> None:
    class FailingWrites(MemoryCacheStore):
        async def _set(self, key: str, value: bytes, ttl: int) -> None:
            raise OSError("disk full")

        async def _expire(self, key: str, ttl: int) -> None:
            raise OSError("disk full")

    store = FailingWrites(timeout_ms=200)
    service, cache = make_service(store=store)
    await run(service, miss_messages())
    m = cache.metrics
    assert m.cacheable_misses.labels("translate")._value.get() == 1
    assert m.store_failures.labels("translate")._value.get() == 1
    assert m.stores.labels("translate")._value.get() == 0
    assert m.errors.labels("set")._value.get() == 1
