"""The decision's hot path to Redis: one lean pipelined connection per store.

redis-py costs ~100 µs of CPU per EVALSHA on the event loop (command packing, a pipeline
object, futures and tasks, its `wait_for` socket timeout), several times what rls spends on the
decision itself. This connection carries only what the decisions send:

- redis-py opens it (`make_connection`: DNS, TLS, AUTH/ACL, SELECT, CLIENT SETNAME, Sentinel's
  master lookup), then hands its transport to `_Protocol`;
- every command queued during one loop turn goes out in one write; replies come back through
  one `hiredis.Reader` and are matched to their callers in order (a deque of futures);
- deadlines are `stores/deadline.Deadline`s, watched by one timer handle per written batch
  (no Task or `asyncio.timeout` per call); a caller whose deadline passed gets TimeoutError and
  its reply, when it comes, is dropped in order;
- a lost connection fails every call in flight with ConnectionError (breaker evidence) and is
  reopened in the background with back-off (first at once, then doubling up to
  `MAX_BACKOFF_S`); meanwhile calls fail at once;
- a Sentinel master demoted under us (`READONLY`) closes the connection: reopening asks
  Sentinel for the new master;
- bounded: at most `max_inflight` calls wait on the connection (beyond, ConnectionError), and
  a connection with calls in flight that has not answered for `stale_s` is closed.

Errors come back as redis-py's exception types, so the store's error handling is one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import hiredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ReadOnlyError, ResponseError

from rls.stores.deadline import Deadline

log = logging.getLogger("rls.backend")

MAX_BACKOFF_S = 0.2  # a reconnecting wire tries at least this often
ReplyError = hiredis.ReplyError


def pack(*args: Any) -> bytes:
    """One command in RESP, packed by hiredis (C)."""
    packed: bytes = hiredis.pack_command(args)
    return packed


def reply_exception(reply: Exception) -> Exception:
    """redis-py's exception for an error reply."""
    text = str(reply)
    if text.startswith("NOSCRIPT"):
        return NoScriptError(text)
    if text.startswith("READONLY"):
        return ReadOnlyError(text)
    return ResponseError(text)


Item = tuple[Sequence[Any], Sequence[Any]]  # (keys, args) of one mergeable call


class Merger(Protocol):
    """How calls queued in one loop turn may travel as one command (rls/stores/redis/scripts.py
    `LeanBatch`): `one` packs a call alone, `many` packs several (at least `min_depth`, at most
    `max_items`) into one command whose reply `split` cuts into each call's reply; `failed`
    hears an error reply of a merged command (e.g. NOSCRIPT: load the script)."""

    min_depth: int
    max_items: int

    def one(self, keys: Sequence[Any], args: Sequence[Any]) -> bytes: ...

    def many(self, items: Sequence[Item]) -> bytes: ...

    def split(self, reply: Any, items: Sequence[Item]) -> list[Any]: ...

    def failed(self, reply: Exception) -> None: ...


class _Merged:
    """Stands in the reply queue for a merged command: hands each call its part."""

    __slots__ = ("futures", "items", "merger")

    def __init__(
        self, merger: Merger, items: list[Item], futures: list[asyncio.Future[Any]]
    ) -> None:
        self.merger = merger
        self.items = items
        self.futures = futures

    def done(self) -> bool:
        return False

    def set_result(self, reply: Any) -> None:
        if isinstance(reply, ReplyError):
            self.merger.failed(reply)
            parts = [reply] * len(self.futures)  # each call sees the error (and may retry)
        else:
            parts = self.merger.split(reply, self.items)
        for future, part in zip(self.futures, parts, strict=True):
            if not future.done():
                future.set_result(part)

    def set_exception(self, exc: BaseException) -> None:
        for future in self.futures:
            if not future.done():
                future.set_exception(exc)


class _Protocol(asyncio.Protocol):
    """Replies in, matched in order to the futures of the calls that sent them."""

    def __init__(self, wire: Wire, transport: Any, waiting: deque[Any]) -> None:
        self.wire = wire
        self.transport = transport
        self.reader = hiredis.Reader()
        self.waiting = waiting
        self.replied_at = 0.0

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        waiting = self.waiting
        reply = reader.gets()
        while reply is not False:
            future = waiting.popleft()
            if not future.done():
                future.set_result(reply)
            reply = reader.gets()
        self.replied_at = self.wire.loop.time()

    def eof_received(self) -> bool:
        return False  # close

    def connection_lost(self, exc: Exception | None) -> None:
        self.wire.lost(self, exc)


class Wire:
    """A lean connection: `await wire.call(payload, deadline)` sends one packed command."""

    loop: asyncio.AbstractEventLoop  # the running loop, from the first connect on

    def __init__(
        self,
        open_connection: Callable[[], Any],
        *,
        merger: Merger | None = None,
        max_inflight: int = 10_000,
        stale_s: float = 1.0,
    ) -> None:
        self._open_connection = open_connection  # () -> an unconnected redis-py Connection
        self._merger = merger
        self._merging: list[Item] = []  # mergeable calls of this loop turn, in order
        self._merging_futures: list[asyncio.Future[Any]] = []
        self.max_inflight = max_inflight
        self.stale_s = stale_s
        self._proto: _Protocol | None = None
        self._conn: Any = None  # redis-py's Connection, kept so it does not close the socket
        self._out: list[bytes] = []
        self._watch: list[tuple[asyncio.Future[Any], Deadline]] = []
        self._scheduled = False
        self._reopening: asyncio.Task[None] | None = None
        self._opening: asyncio.Future[None] | None = None  # the first connect, shared
        self._opened = False  # connected once: from then on, losses reopen in the background
        self._closed = False
        self._kick = asyncio.Event()  # ends the reconnect's back-off sleep (see `ready`)
        self.last_error = ""

    @property
    def connected(self) -> bool:
        return self._proto is not None

    async def open(self) -> None:
        """The first connect (at start-up, or by the first call when nobody started the store):
        shared by every caller meanwhile; raises what redis-py raises when it cannot connect.
        Once connected, a lost connection is reopened in the background instead."""
        if self._opened:
            if self._proto is None:
                self._reopen()
                raise RedisConnectionError(f"redis: reconnecting ({self.last_error})")
            return
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._connect())
        opening = self._opening
        try:
            await asyncio.shield(opening)
        finally:
            if opening.done() and self._opening is opening:
                self._opening = None

    async def _connect(self) -> None:
        self.loop = asyncio.get_running_loop()
        conn = self._open_connection()
        await conn.connect()
        writer = conn._writer
        transport = writer.transport
        buffered = bytes(conn._reader._buffer) if conn._reader is not None else b""
        proto = _Protocol(self, transport, deque())
        transport.set_protocol(proto)
        if buffered:  # nothing is expected after the handshake, but never lose a byte
            proto.reader.feed(buffered)
        proto.replied_at = self.loop.time()
        self._conn = conn
        self._proto = proto
        self._opened = True

    def call(self, payload: bytes, deadline: Deadline | None = None) -> asyncio.Future[Any]:
        """Queue one packed command; its future gets the reply (an error reply as a
        `hiredis.ReplyError` value, see `reply_exception`), ConnectionError when the connection
        is lost, or is cancelled when `deadline` expires (`deadline.reason` then says why)."""
        waiting = self._room().waiting
        future = self._queued(deadline)
        waiting.append(future)
        self._out.append(payload)
        return future

    def merge(
        self, keys: Sequence[Any], args: Sequence[Any], deadline: Deadline | None = None
    ) -> asyncio.Future[Any]:
        """Like `call`, for a call the merger packs: sent alone, or with the other mergeable
        calls of this loop turn as one command when there are at least `min_depth`."""
        self._room()
        future = self._queued(deadline)
        self._merging.append((keys, args))
        self._merging_futures.append(future)
        return future

    def _room(self) -> _Protocol:
        """The open connection, if it has room for one more call (else ConnectionError)."""
        proto = self._proto
        if proto is None:
            self._reopen()
            raise RedisConnectionError(f"redis: reconnecting ({self.last_error or 'closed'})")
        queued = len(proto.waiting) + len(self._merging)
        if queued >= self.max_inflight:
            raise RedisConnectionError(f"redis: {queued} calls in flight on the wire")
        return proto

    def _queued(self, deadline: Deadline | None) -> asyncio.Future[Any]:
        """A new call's future, its deadline watched, the flush of this loop turn scheduled."""
        future: asyncio.Future[Any] = self.loop.create_future()
        if deadline is not None:
            deadline.on_expire = future.cancel
            self._watch.append((future, deadline))
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._flush)
        return future

    def _merged(self, waiting: deque[Any]) -> list[bytes]:
        """The payloads of this turn's mergeable calls, their futures queued for the replies."""
        merger = self._merger
        items, futures = self._merging, self._merging_futures
        self._merging, self._merging_futures = [], []
        assert merger is not None
        if len(items) < merger.min_depth:
            waiting.extend(futures)
            return [merger.one(keys, args) for keys, args in items]
        payloads = []
        step = merger.max_items
        for i in range(0, len(items), step):
            chunk, chunk_futures = items[i:i + step], futures[i:i + step]
            if len(chunk) < merger.min_depth:
                waiting.extend(chunk_futures)
                payloads += [merger.one(keys, args) for keys, args in chunk]
            else:
                waiting.append(_Merged(merger, chunk, chunk_futures))
                payloads.append(merger.many(chunk))
        return payloads

    def _flush(self) -> None:
        """One write for everything queued this loop turn, and one timer for its deadlines."""
        self._scheduled = False
        out, self._out = self._out, []
        proto = self._proto
        if self._merging:
            if proto is None:
                failure = RedisConnectionError(f"redis: connection lost ({self.last_error})")
                for future in self._merging_futures:
                    if not future.done():
                        future.set_exception(failure)
                self._merging, self._merging_futures = [], []
            else:
                out += self._merged(proto.waiting)
        if proto is not None and out:
            proto.transport.write(b"".join(out) if len(out) > 1 else out[0])
        watch = self._watch
        if watch:
            self._watch = []
            first = min(d.first_check() for _, d in watch)
            self.loop.call_at(first, self._check, watch)

    def _check(self, watch: list[tuple[asyncio.Future[Any], Deadline]]) -> None:
        """The batch's deadlines: expire the due ones, look again at the earliest of the rest."""
        now = self.loop.time()
        rest = []
        again = 0.0
        expired = False
        for future, deadline in watch:
            if future.done():
                continue
            when = deadline.check(now)
            if when is None:
                expired = True
                continue
            rest.append((future, deadline))
            again = when if not again or when < again else again
        if rest:
            self.loop.call_at(again, self._check, rest)
        proto = self._proto
        if expired and proto is not None and proto.waiting:
            if now - proto.replied_at > self.stale_s:  # in flight, and no reply for long
                self.last_error = f"no reply for {now - proto.replied_at:.1f} s"
                proto.transport.abort()

    def lost(self, proto: _Protocol, exc: Exception | None) -> None:
        """A connection closed: fail what waits on it; the current one reopens."""
        if exc is not None:
            self.last_error = str(exc) or type(exc).__name__
        elif not self.last_error:
            self.last_error = "connection closed by redis"
        failure = RedisConnectionError(f"redis: connection lost ({self.last_error})")
        waiting = proto.waiting
        while waiting:
            future = waiting.popleft()
            if not future.done():
                future.set_exception(failure)
        if self._proto is proto:
            self._proto = None
            self._out = []
            self._drop_conn()
            self._reopen()

    def reset(self, why: str) -> None:
        """Close the connection (a demoted master): calls in flight fail, it reopens."""
        proto = self._proto
        if proto is not None:
            self.last_error = why
            proto.transport.abort()

    def _reopen(self) -> None:
        if self._closed or self._reopening is not None:
            return
        loop = asyncio.get_running_loop()
        self._reopening = loop.create_task(self._reopen_with_backoff(), name="rls-wire")

    async def _reopen_with_backoff(self) -> None:
        backoff = 0.0
        try:
            while not self._closed:
                try:
                    await self._connect()
                    log.info("redis wire reconnected")
                    return
                except Exception as exc:
                    self.last_error = str(exc) or type(exc).__name__
                    self._drop_conn()
                backoff = min(MAX_BACKOFF_S, backoff * 2 or 0.025)
                self._kick.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._kick.wait(), backoff)
        finally:
            self._reopening = None

    async def ready(self, timeout: float) -> bool:
        """Whether the connection is open, reconnecting now (not at the end of the back-off)
        when it was lost. The breaker's probe asks: a probe that finds Redis back must not
        close the breaker while the wire sleeps up to `MAX_BACKOFF_S` more, failing every call
        with "reconnecting" (the breaker then flapped, and the failure mode answered calls
        Redis could have decided)."""
        if self._proto is not None or not self._opened:
            return True
        self._reopen()
        self._kick.set()
        task = self._reopening
        if task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), timeout)
        return self._proto is not None

    def _drop_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn._close()

    async def close(self) -> None:
        self._closed = True
        task = self._reopening
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        proto = self._proto
        self._proto = None
        if proto is not None:
            proto.transport.close()
            waiting = proto.waiting
            while waiting:
                future = waiting.popleft()
                if not future.done():
                    future.set_exception(RedisConnectionError("redis: store closed"))
        self._drop_conn()
