"""The cache's background writer: stores and TTL refreshes off the reply path, never lost.

Why a writer rather than a task per write: Envoy ends the ext_proc stream as soon as it has the
last reply, and grpc.aio then cancels the handler. Work the handler would start *after* writing
that reply never starts (measured: up to 43 % of stores and 51 % of refreshes were lost).
So the servicer hands each write to this writer *before* the reply goes out: `submit` is
synchronous (no await, so no cancellation point), and from then on the job is owned by
long-lived worker tasks that hold strong references and outlive the stream.

Bounded: at most `max_jobs` queued jobs and `max_bytes` of entry data; a job that does not fit
is dropped and counted (`rls_cache_writes_dropped_total{kind,api}`), never waited for, so the
reply path never blocks on a slow store. `close` drains what is queued within a deadline; jobs
still pending then are cancelled and counted as dropped. Every submitted job ends in exactly
one counter (see rls/response_cache/metrics.py for the sums).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rls.response_cache.metrics import CacheMetrics

log = logging.getLogger("rls.cache")

STORE = "store"
REFRESH = "refresh"


@dataclass(slots=True)
class WriteJob:
    """One store or refresh. `run` returns True when written, False when it failed (it logs
    and counts store errors itself); `on_drop` undoes what the submitter set up (a coalescing
    fill) when the job will never run."""

    kind: str  # STORE or REFRESH
    api: str
    run: Callable[[], Awaitable[bool]]
    size: int = 0
    on_drop: Callable[[], None] | None = None


class CacheWriter:
    def __init__(
        self,
        metrics: CacheMetrics,
        workers: int = 4,
        max_jobs: int = 1000,
        max_bytes: int = 64 << 20,
    ) -> None:
        self.metrics = metrics
        self.workers = workers
        self.max_jobs = max_jobs
        self.max_bytes = max_bytes
        self._queue: asyncio.Queue[WriteJob] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []  # strong references to the workers
        self._pending = 0  # queued + running
        self._bytes = 0
        self._closed = False

    @property
    def pending(self) -> int:
        """Jobs queued or running; 0 means every submitted write has its outcome counted."""
        return self._pending

    def submit(self, job: WriteJob) -> bool:
        """Queue `job` without waiting; False (and counted as dropped) when it does not fit."""
        if (
            self._closed
            or self._queue.qsize() >= self.max_jobs
            or (self._bytes + job.size > self.max_bytes and self._pending > 0)
        ):
            self._drop(job, "writer closed" if self._closed else "writer queue full")
            return False
        self._start()
        self._pending += 1
        self._bytes += job.size
        self.metrics.write_queue.set(self._pending)
        self.metrics.write_queue_bytes.set(self._bytes)
        self._queue.put_nowait(job)
        return True

    def _start(self) -> None:
        if self._tasks:
            return
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._work(), name=f"rls-cache-writer-{i}")
            for i in range(self.workers)
        ]

    async def _work(self) -> None:
        while True:
            job = await self._queue.get()
            try:
                ok = await job.run()
            except asyncio.CancelledError:
                self._finish(job, None)
                raise
            except Exception:  # a bug, not a store error: count it, keep the worker alive
                log.exception("cache %s for api %s failed", job.kind, job.api)
                ok = False
            self._finish(job, ok)

    def _finish(self, job: WriteJob, ok: bool | None) -> None:
        self._queue.task_done()
        self._pending -= 1
        self._bytes -= job.size
        if ok is None:
            self._count_drop(job)
        elif job.kind == STORE:
            (self.metrics.stores if ok else self.metrics.store_failures).labels(job.api).inc()
        else:
            (self.metrics.refreshes if ok else self.metrics.refresh_failures).labels(job.api).inc()
        self.metrics.write_queue.set(self._pending)
        self.metrics.write_queue_bytes.set(self._bytes)

    def _drop(self, job: WriteJob, why: str) -> None:
        log.debug("cache %s for api %s dropped: %s", job.kind, job.api, why)
        self._count_drop(job)

    def _count_drop(self, job: WriteJob) -> None:
        self.metrics.writes_dropped.labels(job.kind, job.api).inc()
        if job.on_drop is not None:
            job.on_drop()

    async def idle(self) -> None:
        """Wait until every queued job has run (for tests and for draining)."""
        await self._queue.join()

    async def close(self, timeout: float) -> None:
        """Stop taking jobs, let queued ones finish within `timeout`, drop the rest (counted)."""
        self._closed = True
        if self._tasks and self._pending:
            try:
                await asyncio.wait_for(self._queue.join(), timeout)
            except TimeoutError:
                log.warning("cache writer: %d writes still pending at shutdown, dropped",
                            self._pending)
        for task in self._tasks:
            task.cancel()  # a running job counts itself as dropped
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        while not self._queue.empty():
            self._finish(self._queue.get_nowait(), None)
