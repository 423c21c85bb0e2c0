"""Redis counters: one EVALSHA per request covering all of its checks (one round trip).

Decisions on standalone Redis and Sentinel go through the lean connection of
`rls/stores/wire.py` (opened by redis-py, then one write per loop turn and hiredis replies;
NOSCRIPT loads the script and sends the call again). Cluster decisions, usage statistics, and
everything else go through redis-py (its Script object reloads a script on NOSCRIPT by itself),
as do all decisions with `auto_pipeline=False`. The URL schemes (standalone, TLS, unix,
Sentinel, Cluster) and the client built for each are `rls/stores/connect.py`'s job.

Cluster: keys carry no hash tag, so counters spread over all slots. A request whose keys share
one slot is decided atomically in one call. A request spanning slots is decided in two steps:
evaluate on every slot (no writes), apply the admission rule across all checks, then charge
per slot as admitted or rejected. Between the two steps a concurrent request may take the
last unit of a counter; the charge step re-checks room and the answer follows it (refused), so
neither a limit nor the admitted count is ever exceeded, and the charges such a refused request
made on its other slots are released right after (`_settle_cluster`): for that moment those
counters read high, so under contention a multi-slot request can under-admit, never over-admit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import (
    MaxConnectionsError,
    NoScriptError,
    ReadOnlyError,
    RedisError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

from rls.core.admission import admit
from rls.core.algorithms.registry import BY_NAME, REGISTRY
from rls.core.model import NEGATIVE, Check, Outcome, Verdict
from rls.core.usage import UsageOp
from rls.stores.base import BackendError, StoreDown
from rls.stores.breaker import CircuitBreaker
from rls.stores.clock import StoreClock
from rls.stores.connect import connect, refusal
from rls.stores.deadline import Deadline, Guard
from rls.stores.node_breakers import NodeBreakers
from rls.stores.scripts import (
    LeanBatch,
    decide_script,
    lean_batch_script,
    lean_script,
    request_args,
)
from rls.stores.scripts import lean_verdict as _lean_verdict
from rls.stores.scripts import verdict as _verdict
from rls.stores.windows import store_key
from rls.stores.wire import ReplyError, Wire, pack, reply_exception


def _queue_usage(pipe: Any, ops: Sequence[UsageOp], ttl_ms: int) -> None:
    for kind, key, member in ops:
        if kind == "h":
            pipe.pfadd(key, member)
        else:
            pipe.incr(key)
        pipe.pexpire(key, ttl_ms)


async def _reply(future: asyncio.Future[Any], deadline: Deadline | None) -> Any:
    """The wire's reply; TimeoutError when the call's deadline cancelled it."""
    try:
        return await future
    except asyncio.CancelledError:
        if deadline is None or deadline.reason is None:
            raise  # our caller was cancelled
        raise TimeoutError(deadline.reason) from None


def _observed(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class StoreRejected(BackendError):
    """The store answers but refuses us (wrong password, ACL): not ready, and it says why."""


class RedisBackend:
    name = "redis"
    own_deadlines = True  # decide() takes the call's Deadline (the wire watches it per batch)

    def __init__(
        self,
        url: str,
        *,
        timeout_ms: int = 50,
        connect_timeout_ms: int = 200,
        pool_size: int = 64,
        breaker: CircuitBreaker | None = None,
        auto_pipeline: bool = True,
        probe_timeout_ms: int = 200,
    ) -> None:
        self.url = url
        # redis-py's own socket timeout is only a backstop: the limiter's deadline (store time,
        # net of our own lag) decides when a call is too slow.
        socket_timeout = max(timeout_ms / 1000, 1.0)
        self.client: Any = connect(url, socket_timeout, connect_timeout_ms / 1000, pool_size)
        self.cluster = isinstance(self.client, RedisCluster)
        # The lean fixed-window script, and one script per mix of algorithms built on first use
        # (at most 2^len(REGISTRY), keyed by a bit per algorithm): rls/stores/scripts.py.
        self._lean = self.client.register_script(lean_script())
        self._lean_batch = self.client.register_script(lean_batch_script())
        self._mixes: dict[int, Any] = {}
        # The decisions' lean connection (standalone and Sentinel; redis-py opens it).
        self._wire = (
            Wire(
                self.client.connection_pool.make_connection,
                merger=LeanBatch(self._lean.sha, self._lean_batch.sha, self._reload_batch),
                stale_s=socket_timeout,
            )
            if auto_pipeline and not self.cluster else None
        )
        self.pool_size = pool_size
        # redis-py's cluster client fails a call at once (MaxConnectionsError) when a node's
        # pool is busy, where the standalone pool waits: a burst would then read as a failing
        # store. Calls wait for a slot here instead (their deadline still bounds the wait).
        self.slots = asyncio.Semaphore(pool_size) if self.cluster else None  # shared: counters
        self.breaker = breaker or CircuitBreaker("redis")
        # The probe's own blocking connection, used from its own thread: its socket timeout
        # runs in the kernel, so a busy or paused event loop cannot fail a healthy store.
        probe_s = probe_timeout_ms / 1000
        self._probe_client: Any = connect(url, probe_s, probe_s, 1, sync=True)
        self._probe_thread = ThreadPoolExecutor(1, thread_name_prefix="rls-store-probe")
        self.breaker.set_probe(self.probe)
        # Cluster: each call is judged by the breakers of the masters owning its slots.
        self._nodes = (
            NodeBreakers(
                self.client, self._probe_client, self._probe_thread, self._node_breaker,
                self.breaker.probe_interval,
            )
            if self.cluster else None
        )
        # Redis TIME read locally, for the windows of plain fixed windows (rls/stores/clock.py);
        # read on the probe's connection and thread, so our own lag cannot skew a reading.
        self.clock = StoreClock()
        self._clock_task: asyncio.Task[None] | None = None

    def _reload_batch(self) -> None:
        """A batch met NOSCRIPT (Redis restarted or flushed): load the batch script, while its
        requests are sent again alone (each loads the lean script itself)."""
        if self._wire is not None and self._wire.connected:
            loading = self._wire.call(pack(b"SCRIPT", b"LOAD", self._lean_batch.script))
            loading.add_done_callback(_observed)

    def _node_breaker(self, name: str) -> CircuitBreaker:
        assert self._nodes is not None
        nodes = self._nodes

        def changed(_state: str) -> None:
            self.breaker.report("open" if nodes.any_open() else "closed")

        return CircuitBreaker(
            f"redis {name}", self.breaker.threshold, probe_interval=self.breaker.probe_interval,
            on_change=changed,
        )

    def _judge(self, checks: Sequence[Check], now_ms: int | None) -> tuple[int | None, Any]:
        """The breaker that judges this call: on Cluster, those of the masters owning its
        slots (at the time its windows are of, fixed here for all of its steps)."""
        if self._nodes is None:
            return now_ms, self.breaker
        now = self.clock.now_ms() if now_ms is None else now_ms
        names = {self._nodes.owner(self.client.keyslot(store_key(c, now))) for c in checks}
        if None in names:  # no slot map yet: the client reads it on this call
            return now, self.breaker
        return now, self._nodes.group(names)  # type: ignore[arg-type]

    async def _direct(self, script: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if self.slots is None:
            return await script(keys=keys, args=args)  # redis-py reloads it on NOSCRIPT
        async with self.slots:
            return await script(keys=keys, args=args)

    async def probe(self) -> bool:
        """PING on the probe connection (in its thread); False on any error or timeout."""
        loop = asyncio.get_running_loop()
        try:
            return bool(await loop.run_in_executor(self._probe_thread, self._probe_client.ping))
        except (RedisError, OSError) as exc:
            self.breaker.last_error = str(exc) or type(exc).__name__
            return False

    def suspect(self) -> None:
        """A call used its whole store budget: let the probe find out whether Redis is ill."""
        self.breaker.suspect()

    def check_health(self) -> asyncio.Future[bool]:
        """Whether Redis answers a probe now (shared by every call that asks meanwhile)."""
        return self.breaker.check()

    async def start(self) -> None:
        """Ready means ready: the store answers, accepts our credentials, has our scripts and
        lets us run them, and a few pooled connections are open for the first burst.

        Raises StoreRejected when the store refuses us (wrong password, ACL) and BackendError
        when it cannot be reached; the server retries until this returns.
        """
        try:
            await self.client.ping()
            await self.load_scripts(spec.name for spec in REGISTRY)
            await self._lean(keys=[], args=["e"])  # EVALSHA allowed (ACL)?
            warm = min(self.pool_size, 8)
            await asyncio.gather(*(self.client.ping() for _ in range(warm)))
            if self._wire is not None:
                await self._wire.open()
            await self.clock.sync_in(self._probe_thread, self._probe_client.time)
        except (RedisError, OSError) as exc:
            why = refusal(exc)
            if why is not None:
                raise StoreRejected(f"redis refuses rls: {why}") from exc
            raise BackendError(f"redis not reachable: {exc}") from exc
        if self._clock_task is None:
            self._clock_task = asyncio.create_task(
                self.clock.keep(self._probe_thread, self._probe_client.time, (RedisError, OSError)),
                name="rls-store-clock",
            )
        self.breaker.close()

    async def close(self) -> None:
        if self._clock_task is not None:
            self._clock_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._clock_task
            self._clock_task = None
        await self.breaker.stop()
        if self._nodes is not None:
            await self._nodes.stop()
        if self._wire is not None:
            await self._wire.close()
        await self.client.aclose()
        pool = getattr(self.client, "connection_pool", None)
        if pool is not None:
            await pool.disconnect()
        self._probe_thread.shutdown(wait=False)
        with contextlib.suppress(Exception):
            self._probe_client.close()

    async def healthy(self) -> bool:
        try:
            return bool(await self.client.ping())
        except (RedisError, OSError):
            return False

    async def decide(
        self,
        checks: Sequence[Check],
        now_ms: int | None = None,
        usage: Sequence[UsageOp] = (),
        usage_ttl_ms: int = 0,
        deadline: Deadline | None = None,
    ) -> Verdict:
        """`deadline`: the call's budget (TimeoutError when it expires, `deadline.reason` says
        why): watched by the wire's batch timer on the lean path, else by a `Guard`."""
        now_ms, breaker = self._judge(checks, now_ms)
        if not breaker.allow():
            raise StoreDown("redis circuit open")
        if deadline is not None and deadline.probe is not None and breaker is not self.breaker:
            deadline.probe = breaker.check  # ask the call's own masters
        try:
            if self._wire is not None and not usage:
                verdict = await self._run(checks, now_ms, "d", deadline)
            elif deadline is None:
                verdict = await self._decide_slow_path(checks, now_ms, usage, usage_ttl_ms)
            else:
                async with Guard(deadline):
                    verdict = await self._decide_slow_path(checks, now_ms, usage, usage_ttl_ms)
        except TimeoutError:
            if breaker is not self.breaker:
                breaker.suspect()  # Cluster: ask the call's masters (the limiter asks the store)
            raise  # the call's deadline (an OSError too, but no news of the connection)
        except RedisTimeoutError as exc:
            breaker.suspect()  # redis-py's socket timeout: a suspicion, the probe decides
            raise BackendError(f"redis: {exc}") from exc
        except MaxConnectionsError as exc:
            raise BackendError(f"redis: {exc}") from exc  # our own pool, no news of the store
        except (RedisConnectionError, OSError) as exc:
            breaker.failure(str(exc))  # evidence about the store: refused, reset, auth lost
            raise BackendError(f"redis: {exc}") from exc
        except RedisError as exc:
            breaker.suspect()  # an error reply (OOM, READONLY…): the store answers, but ask
            raise BackendError(f"redis: {exc}") from exc
        except (AttributeError, TypeError, ValueError, IndexError, RuntimeError) as exc:
            # redis-py can surface a connection torn down mid-call (e.g. cut by the deadline)
            # as a plain Python error; it is still the store failing, not a bad request.
            breaker.suspect()
            raise BackendError(f"redis client error: {exc!r}") from exc
        breaker.success()
        return verdict

    async def _decide_slow_path(
        self, checks: Sequence[Check], now_ms: int | None, usage: Sequence[UsageOp],
        usage_ttl_ms: int,
    ) -> Verdict:
        """Through redis-py: Cluster, decisions with usage statistics, or no wire."""
        if self.cluster:
            if usage:
                verdict, _ = await asyncio.gather(
                    self._decide_cluster(checks, now_ms),
                    self.record_usage(usage, usage_ttl_ms),
                )
                return verdict
            return await self._decide_cluster(checks, now_ms)
        if usage:
            return await self._run_with_usage(checks, now_ms, usage, usage_ttl_ms)
        return await self._run(checks, now_ms, "d")

    async def record_usage(
        self, ops: Sequence[UsageOp], ttl_ms: int, now_ms: int | None = None
    ) -> None:
        pipe = self.client.pipeline(transaction=False)
        _queue_usage(pipe, ops, ttl_ms)
        try:
            await pipe.execute()
        except (RedisError, OSError) as exc:
            raise BackendError(f"redis: {exc}") from exc

    async def usage_value(self, kind: str, key: str) -> int:
        try:
            value = await (self.client.pfcount(key) if kind == "h" else self.client.get(key))
        except (RedisError, OSError) as exc:
            raise BackendError(f"redis: {exc}") from exc
        return int(value or 0)

    async def _run_with_usage(
        self, checks: Sequence[Check], now_ms: int | None, ops: Sequence[UsageOp], ttl_ms: int
    ) -> Verdict:
        """The decision and the usage counters in one pipelined round trip.

        On NOSCRIPT (Redis restarted or flushed) the usage commands have already run, so only
        the script is sent again — usage is never counted twice.
        """
        script, keys, args, now = self._script_args(checks, now_ms, "d")
        pipe = self.client.pipeline(transaction=False)
        pipe.evalsha(script.sha, len(keys), *keys, *args)
        _queue_usage(pipe, ops, ttl_ms)
        results = await pipe.execute(raise_on_error=False)
        for extra in results[1:]:
            if isinstance(extra, Exception):
                raise extra
        res = results[0]
        if isinstance(res, NoScriptError):
            res = await script(keys=keys, args=args)  # loads the script, then EVALSHA
        elif isinstance(res, Exception):
            raise res
        return self._verdict(script, res, checks, "d", now)

    async def peek(self, checks: Sequence[Check], now_ms: int | None = None) -> Verdict:
        """Evaluate without charging (counter queries); one call per slot in Cluster mode."""
        try:
            if not self.cluster:
                return await self._run(checks, now_ms, "e")
            if now_ms is None:
                now_ms = self.clock.now_ms()  # one window per counter for every slot
            outcomes: list[Outcome | None] = [None] * len(checks)
            for idx in self._slots(checks, now_ms):
                verdict = await self._run([checks[i] for i in idx], now_ms, "e")
                for i, out in zip(idx, verdict.outcomes, strict=True):
                    outcomes[i] = out
            return Verdict(all(o.ok for o in outcomes if o), outcomes)  # type: ignore[arg-type]
        except (RedisError, OSError) as exc:
            raise BackendError(f"redis: {exc}") from exc

    async def load_scripts(self, algorithms: Iterable[str] = ()) -> None:
        """SCRIPT LOAD the lean script and the single-algorithm script of each named algorithm,
        so that a process can say it is ready before its first call. (Any other mix loads on
        first use: EVALSHA answers NOSCRIPT once and redis-py loads it.)"""
        scripts = [
            self._lean, self._lean_batch,
            *(self._mix(1 << BY_NAME[name].id) for name in algorithms),
        ]
        for script in scripts:
            await self.client.script_load(script.script)

    def _mix(self, mask: int) -> Any:
        """The script for the algorithms whose bits are set in `mask`, registered once."""
        script = self._mixes.get(mask)
        if script is None:
            names = [spec.name for spec in REGISTRY if mask & (1 << spec.id)]
            script = self._mixes[mask] = self.client.register_script(decide_script(names))
        return script

    def _slots(self, checks: Sequence[Check], now_ms: int) -> list[list[int]]:
        """Indexes of the checks grouped by the Cluster slot of their keys at `now_ms`."""
        groups: dict[int, list[int]] = {}
        for i, c in enumerate(checks):
            groups.setdefault(self.client.keyslot(store_key(c, now_ms)), []).append(i)
        return list(groups.values())

    def _script_args(
        self, checks: Sequence[Check], now_ms: int | None, mode: str
    ) -> tuple[Any, list[str], list[Any], int]:
        """The script for this request, its KEYS, its ARGV (rls/stores/scripts.py
        `request_args`), and the time its windows are of: `now_ms` when the caller fixes the
        time, else the store's clock (other algorithms then read Redis TIME in the script)."""
        now = self.clock.now_ms() if now_ms is None else now_ms
        keys = [store_key(c, now) for c in checks]
        mask, args = request_args(checks, mode, now_ms, now)
        return (self._lean if mask is None else self._mix(mask)), keys, args, now

    def _verdict(
        self, script: Any, res: list[Any], checks: Sequence[Check], mode: str, now: int
    ) -> Verdict:
        if script is self._lean:
            return _lean_verdict(res, checks, mode, now)
        return _verdict(res)

    async def _run(
        self, checks: Sequence[Check], now_ms: int | None, mode: str,
        deadline: Deadline | None = None,
    ) -> Verdict:
        script, keys, args, now = self._script_args(checks, now_ms, mode)
        if self._wire is not None:
            res = await self._eval(script, keys, args, deadline)
        else:
            res = await self._direct(script, keys, args)
        return self._verdict(script, res, checks, mode, now)

    async def _eval(
        self, script: Any, keys: Sequence[str], args: Sequence[Any], deadline: Deadline | None
    ) -> Any:
        """EVALSHA on the wire; on NOSCRIPT (Redis restarted, flushed or failed over) the
        script is loaded and the call sent again, on the same connection, in order."""
        wire = self._wire
        assert wire is not None
        if not wire.connected:
            await wire.open()  # the first call of a store nobody started, or reconnecting
        if script is self._lean:  # alone, or batched with the others of this loop turn
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
            loading.add_done_callback(_observed)  # its answer is the EVALSHA's behind it
            res = await _reply(wire.call(payload, deadline), deadline)
            if type(res) is not ReplyError:
                return res
            exc = reply_exception(res)
        if isinstance(exc, ReadOnlyError):  # a demoted master (failover): find the new one
            wire.reset(str(exc))
            raise RedisConnectionError(f"redis: {exc}")
        raise exc

    async def _decide_cluster(self, checks: Sequence[Check], now_ms: int | None) -> Verdict:
        if now_ms is None:
            now_ms = self.clock.now_ms()  # one time for both steps, all slots and windows
        parts = self._slots(checks, now_ms)
        if len(parts) == 1:
            return await self._run(checks, now_ms, "d")
        evaluated = await asyncio.gather(
            *(self._run([checks[i] for i in idx], now_ms, "e") for idx in parts)
        )
        oks = [False] * len(checks)
        for idx, verdict in zip(parts, evaluated, strict=True):
            for i, out in zip(idx, verdict.outcomes, strict=True):
                oks[i] = out.ok
        admitted, _ = admit([c.flags for c in checks], oks)
        mode = "a" if admitted else "r"
        charged = await asyncio.gather(
            *(self._run([checks[i] for i in idx], now_ms, mode) for idx in parts)
        )
        outcomes: list[Outcome | None] = [None] * len(checks)
        for idx, verdict in zip(parts, charged, strict=True):
            for i, out in zip(idx, verdict.outcomes, strict=True):
                outcomes[i] = out
        if admitted:
            await self._settle_cluster(checks, outcomes, now_ms)  # type: ignore[arg-type]
            admitted, _ = admit([c.flags for c in checks], [o.ok for o in outcomes if o])
        return Verdict(admitted, outcomes)  # type: ignore[arg-type]

    async def _settle_cluster(
        self, checks: Sequence[Check], outcomes: list[Outcome], now_ms: int
    ) -> None:
        """After the charge step of an admitted multi-slot request: if a concurrent request
        took the last unit of a counter between the two steps, the charge step found it full
        and the request is refused after all (never admitted on a stale evaluation). Charges it
        made on the other slots are then given back, as a release on each, so a refused request
        ends up charging nothing (the reference's rule), at the cost of a moment in which those
        counters read high."""
        flags = [c.flags for c in checks]
        admitted, should_charge = admit(flags, [o.ok for o in outcomes])
        if admitted:
            return
        undo = [
            i for i, (c, o) in enumerate(zip(checks, outcomes, strict=True))
            if o.charged and c.hits > 0 and not should_charge[i]
        ]
        if not undo:
            return
        releases = [replace(checks[i], flags=checks[i].flags | NEGATIVE) for i in undo]
        await asyncio.gather(
            *(self._run([releases[i] for i in idx], now_ms, "d")
              for idx in self._slots(releases, now_ms))
        )
        for i in undo:
            outcomes[i] = replace(outcomes[i], charged=False)
