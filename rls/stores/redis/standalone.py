"""Standalone Redis and Sentinel: decisions and counter calls on the lean connection.

Decisions go through the lean connection of `wire.py` (opened by redis-py, then one write per
loop turn and hiredis replies; NOSCRIPT loads the script and sends the call again on the same
connection, in order; a Sentinel master demoted under us answers READONLY and the connection
is reopened on the new master). Decisions with usage statistics, and everything with
`auto_pipeline=False`, go through redis-py (its Script object reloads a script on NOSCRIPT).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ReadOnlyError

from rls.core.model import Check, Verdict
from rls.core.usage import UsageOp
from rls.stores.deadline import Deadline
from rls.stores.redis.clock import StoreClock
from rls.stores.redis.scripts import LeanBatch, ScriptBook, ScriptRunner
from rls.stores.redis.wire import ReplyError, Wire, pack, reply_exception


async def _reply(future: asyncio.Future[Any], deadline: Deadline | None) -> Any:
    """The wire's reply; TimeoutError when the call's deadline cancelled it."""
    try:
        return await future
    except asyncio.CancelledError:
        if deadline is None or deadline.reason is None:
            raise  # our caller was cancelled
        raise TimeoutError(deadline.reason) from None


def observed(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def queue_usage(pipe: Any, ops: Sequence[UsageOp], ttl_ms: int) -> None:
    for kind, key, member in ops:
        if kind == "h":
            pipe.pfadd(key, member)
        else:
            pipe.incr(key)
        pipe.pexpire(key, ttl_ms)


class Standalone(ScriptRunner):
    """One Redis (found directly or through Sentinel): the wire when `lean`, else redis-py."""

    cluster = False

    def __init__(
        self, client: Any, book: ScriptBook, clock: StoreClock, lean: bool,
        stale_s: float,
    ) -> None:
        self.client = client
        self.book = book
        self.clock = clock  # read at each call (tests set its reading)
        self.wire = (
            Wire(
                client.connection_pool.make_connection,
                merger=LeanBatch(book.lean.sha, book.lean_batch.sha, self._reload_batch),
                stale_s=stale_s,
            )
            if lean else None
        )

    def watches(self, usage: Sequence[UsageOp]) -> bool:
        """Whether a decision goes on the wire, which watches its deadline itself."""
        return self.wire is not None and not usage

    async def open(self) -> None:
        if self.wire is not None:
            await self.wire.open()

    async def close(self) -> None:
        if self.wire is not None:
            await self.wire.close()

    async def ready(self, timeout: float) -> bool:
        """Whether decisions can go out now: the wire reconnected if it was lost."""
        return self.wire is None or await self.wire.ready(timeout)

    def _reload_batch(self) -> None:
        """A batch met NOSCRIPT (Redis restarted or flushed): load the batch script, while its
        requests are sent again alone (each loads the lean script itself)."""
        if self.wire is not None and self.wire.connected:
            loading = self.wire.call(pack(b"SCRIPT", b"LOAD", self.book.lean_batch.script))
            loading.add_done_callback(observed)

    async def decide(
        self, checks: Sequence[Check], now_ms: int | None, usage: Sequence[UsageOp],
        usage_ttl_ms: int,
    ) -> Verdict:
        """Through redis-py: decisions with usage statistics, or no wire."""
        if usage:
            return await self._run_with_usage(checks, now_ms, usage, usage_ttl_ms)
        return await self.run(checks, now_ms, "d")

    async def peek(self, checks: Sequence[Check], now_ms: int | None) -> Verdict:
        return await self.run(checks, now_ms, "e")

    async def eval(
        self, script: Any, keys: Sequence[Any], args: Sequence[Any],
        deadline: Deadline | None = None,
    ) -> Any:
        """EVALSHA of a registered script: on the wire when there is one (NOSCRIPT: the
        script is loaded and the call sent again, on the same connection, in order), else
        through redis-py (which reloads it itself)."""
        wire = self.wire
        if wire is None:
            return await script(keys=keys, args=args)
        if not wire.connected:
            await wire.open()  # the first call of a store nobody started, or reconnecting
        if script is self.book.lean:  # alone, or batched with the others of this loop turn
            res = await _reply(wire.merge(keys, args, deadline), deadline)
        else:
            res = await _reply(wire.call(pack(b"EVALSHA", script.sha, len(keys), *keys, *args),
                                         deadline), deadline)
        if type(res) is not ReplyError:
            return res
        exc = reply_exception(res)
        if isinstance(exc, NoScriptError):
            payload = pack(b"EVALSHA", script.sha, len(keys), *keys, *args)
            loading = wire.call(pack(b"SCRIPT", b"LOAD", script.script))
            loading.add_done_callback(observed)  # its answer is the EVALSHA's behind it
            res = await _reply(wire.call(payload, deadline), deadline)
            if type(res) is not ReplyError:
                return res
            exc = reply_exception(res)
        if isinstance(exc, ReadOnlyError):  # a demoted master (failover): find the new one
            wire.reset(str(exc))
            raise RedisConnectionError(f"redis: {exc}")
        raise exc

    async def _run_with_usage(
        self, checks: Sequence[Check], now_ms: int | None, ops: Sequence[UsageOp], ttl_ms: int
    ) -> Verdict:
        """The decision and the usage counters in one pipelined round trip.

        On NOSCRIPT (Redis restarted or flushed) the usage commands have already run, so only
        the script is sent again — usage is never counted twice.
        """
        book = self.book
        script, keys, args, now = book.args(checks, now_ms, "d", self.clock.now_ms)
        pipe = self.client.pipeline(transaction=False)
        pipe.evalsha(script.sha, len(keys), *keys, *args)
        queue_usage(pipe, ops, ttl_ms)
        results = await pipe.execute(raise_on_error=False)
        for extra in results[1:]:
            if isinstance(extra, Exception):
                raise extra
        res = results[0]
        if isinstance(res, NoScriptError):
            res = await script(keys=keys, args=args)  # loads the script, then EVALSHA
        elif isinstance(res, Exception):
            raise res
        return book.verdict(script, res, checks, "d", now)


async def record_usage(client: Any, ops: Sequence[UsageOp], ttl_ms: int) -> None:
    """Usage statistics in one pipelined round trip (any topology: redis-py routes them)."""
    pipe = client.pipeline(transaction=False)
    queue_usage(pipe, ops, ttl_ms)
    await pipe.execute()
