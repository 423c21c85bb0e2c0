"""Auto-pipelining: concurrent EVALSHA calls of one worker share one pipelined round trip.

While a call is on the wire, further calls queue and the flush runs on the next event-loop
turn, so every decision that became ready meanwhile goes out in one write and comes back in one
read. A call with nothing else in flight goes out directly (no future, task or pipeline).
Calls may use different scripts (one per algorithm mix, rls/stores/scripts.py). NOSCRIPT
answers (Redis restarted, failed over or flushed its scripts) load each missing script once and
resend only those calls. A caller whose deadline passed simply finds its future cancelled; the
batch is unaffected.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

# (script, keys, args, future); a script is a redis-py Script: .sha, .script, __call__
Pending = tuple[Any, Sequence[str], Sequence[Any], asyncio.Future[Any]]


class ScriptBatcher:
    def __init__(self, client: Any, max_batch: int = 256) -> None:
        self._client = client
        self._max_batch = max_batch
        self._pending: list[Pending] = []
        self._scheduled = False
        self._busy = False  # a direct call is on the wire
        self._tasks: set[asyncio.Task[None]] = set()

    async def __call__(self, script: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if not self._busy:
            # Nothing queued or in flight: a lone call goes straight out (no future, no task),
            # and calls arriving meanwhile are batched behind it.
            self._busy = True
            try:
                return await script(keys=keys, args=args)
            finally:
                self._busy = False
                if self._pending and not self._scheduled:
                    self._flush()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((script, keys, args, future))
        if len(self._pending) >= self._max_batch:
            self._flush()
        elif not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        self._scheduled = False
        batch, self._pending = self._pending, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[Pending]) -> None:
        if len(batch) == 1:
            script, keys, args, future = batch[0]
            try:
                result: Any = await script(keys=keys, args=args)
            except Exception as exc:
                result = exc
            _settle(future, result)
            return
        try:
            results = await self._pipeline(batch)
            retry = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
            if retry:
                missing = {batch[i][0].sha: batch[i][0].script for i in retry}
                for text in missing.values():
                    await self._client.script_load(text)
                again = await self._pipeline([batch[i] for i in retry])
                for i, result in zip(retry, again, strict=True):
                    results[i] = result
        except Exception as exc:
            results = [exc] * len(batch)
        for entry, result in zip(batch, results, strict=True):
            _settle(entry[3], result)

    async def _pipeline(self, batch: Sequence[Pending]) -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        for script, keys, args, _ in batch:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        return list(await pipe.execute(raise_on_error=False))


def _settle(future: asyncio.Future[Any], result: Any) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
