"""The Redis store: one EVALSHA per request covering all of its checks (one round trip).

What every topology shares lives here: the client built for the URL (`connect.py`: standalone,
TLS, unix, Sentinel, Cluster), the breaker and its probe (a PING on its own blocking
connection, in its own thread), the store's clock (`clock.py`), the scripts (`scripts.py`), the
readiness check, and the one way calls are guarded (`rls.stores.guard.StoreGuard` with this
package's error mapping, `errors.py`). How a call reaches Redis is the topology's:
`standalone.py` (standalone and Sentinel, over the lean wire) or `cluster.py` (per slot, a
breaker per master). The frequency counters ride the same client, guard and topology
(`script_call`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypedDict

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from rls.core.algorithms.registry import REGISTRY
from rls.core.model import Check, Verdict
from rls.core.usage import UsageOp
from rls.event_loop import cancel_and_wait
from rls.stores.base import BackendError
from rls.stores.breaker import CircuitBreaker
from rls.stores.deadline import Deadline
from rls.stores.guard import Breaker, StoreGuard
from rls.stores.redis.clock import StoreClock
from rls.stores.redis.cluster import Cluster
from rls.stores.redis.connect import NO_TLS_CLIENT, TlsClient, connect, refusal
from rls.stores.redis.errors import judge
from rls.stores.redis.leases import Leases
from rls.stores.redis.node_breakers import NodeGroup
from rls.stores.redis.scripts import ScriptBook
from rls.stores.redis.standalone import Standalone, record_usage


class StoreRejected(BackendError):
    """The store answers but refuses us (wrong password, ACL): not ready, and it says why."""



class RedisOptions(TypedDict, total=False):
    """RedisBackend's keyword options, as `rls.stores.create_backend` passes them on (their
    defaults are RedisBackend's)."""

    timeout_ms: int
    connect_timeout_ms: int
    pool_size: int
    breaker: CircuitBreaker | None
    auto_pipeline: bool
    probe_timeout_ms: int
    tls: TlsClient
    leases: list[float] | None

class RedisBackend:
    name = "redis"

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
        tls: TlsClient = NO_TLS_CLIENT,
        leases: list[float] | None = None,
    ) -> None:
        """`leases`: decide hot plain fixed windows from leased tokens (`--redis-leases`,
        leases.py), counting into this list (None: every decision goes to Redis)."""
        self.url = url
        # redis-py's own socket timeout is only a backstop: the limiter's deadline (store time,
        # net of our own lag) decides when a call is too slow.
        socket_timeout = max(timeout_ms / 1000, 1.0)
        self.client: Any = connect(
            url, socket_timeout, connect_timeout_ms / 1000, pool_size, tls=tls
        )
        self.cluster = isinstance(self.client, RedisCluster)
        self.scripts = ScriptBook(self.client)
        self.pool_size = pool_size
        self.breaker = breaker or CircuitBreaker("redis")
        self.guard = StoreGuard(self.breaker, judge, "redis")
        # The probe's own blocking connection, used from its own thread: its socket timeout
        # runs in the kernel, so a busy or paused event loop cannot fail a healthy store.
        probe_s = self._probe_timeout_s = probe_timeout_ms / 1000
        self._probe_client: Any = connect(url, probe_s, probe_s, 1, sync=True, tls=tls)
        self._probe_thread = ThreadPoolExecutor(1, thread_name_prefix="rls-store-probe")
        self.breaker.set_probe(self.probe)
        # Redis TIME read locally, for the windows of plain fixed windows (clock.py); read on
        # the probe's connection and thread, so our own lag cannot skew a reading.
        self.clock = StoreClock()
        self._clock_task: asyncio.Task[None] | None = None
        self.topology: Standalone | Cluster = (
            Cluster(self.client, self.scripts, self.clock, pool_size,
                    self._probe_client, self._probe_thread, self.breaker)
            if self.cluster else
            Standalone(self.client, self.scripts, self.clock, auto_pipeline,
                       socket_timeout)
        )
        self.leases: Leases | None = None
        if leases is not None:
            self.leases = Leases(self.client.register_script, self.script_call,
                                 self.clock.now_ms, leases, max(timeout_ms, 1) / 1000)

    async def probe(self) -> bool:
        """PING on the probe connection (in its thread); False on any error or timeout."""
        loop = asyncio.get_running_loop()
        try:
            if not await loop.run_in_executor(self._probe_thread, self._probe_client.ping):
                return False
        except (RedisError, OSError) as exc:
            self.breaker.last_error = str(exc) or type(exc).__name__
            return False
        # Redis answers; the lean connection must be back too before calls are let through.
        if isinstance(self.topology, Standalone):
            return await self.topology.ready(self._probe_timeout_s)
        return True

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
            await self.scripts.lean(keys=[], args=["e"])  # EVALSHA allowed (ACL)?
            await self._warm_pool()
            await self.topology.open()
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
        if self.leases is not None:
            self.leases.start()
        self.breaker.close()

    async def _warm_pool(self) -> None:
        """Open a few pooled connections for the first burst.

        Best effort: the ping before this already proved the store answers, so a connection
        that is slow to open here (a busy host) is not a reason to call the store unreachable.
        """
        warm = min(self.pool_size, 8)
        await asyncio.gather(*(self.client.ping() for _ in range(warm)), return_exceptions=True)

    async def close(self) -> None:
        if self.leases is not None:  # give the leased tokens back while Redis is still ours
            await self.leases.close()
        await cancel_and_wait(self._clock_task)
        self._clock_task = None
        await self.breaker.stop()
        await self.topology.close()
        await self.client.aclose()
        pool = getattr(self.client, "connection_pool", None)  # Cluster clients have none
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

    def _judged(
        self, checks: Sequence[Check], now_ms: int | None
    ) -> tuple[int | None, NodeGroup | None]:
        """On Cluster, the breakers of the call's masters (None: the store's breaker)."""
        topology = self.topology
        if isinstance(topology, Cluster):
            return topology.judge(checks, now_ms)
        return now_ms, None

    async def decide(
        self,
        checks: Sequence[Check],
        now_ms: int | None = None,
        usage: Sequence[UsageOp] = (),
        usage_ttl_ms: int = 0,
        deadline: Deadline | None = None,
    ) -> Verdict:
        """`deadline`: the call's budget (TimeoutError when it expires, `deadline.reason` says
        why): watched by the wire's batch timer on the lean path, else by `guard.within`. With
        leases, leased checks are decided from them and the others in one call."""
        if self.leases is not None and not usage:
            verdict = await self.leases.decide(
                checks, now_ms, deadline, self._decide_direct, self._peek_within
            )
            if verdict is not None:
                return verdict
        return await self._decide_direct(checks, now_ms, deadline, usage, usage_ttl_ms)

    async def _decide_direct(
        self,
        checks: Sequence[Check],
        now_ms: int | None,
        deadline: Deadline | None,
        usage: Sequence[UsageOp] = (),
        usage_ttl_ms: int = 0,
    ) -> Verdict:
        now_ms, group = self._judged(checks, now_ms)
        topology = self.topology
        if group is not None and deadline is not None and deadline.probe is not None:
            deadline.probe = group.check  # ask the call's own masters
        if topology.watches(usage):
            call = topology.run(checks, now_ms, "d", deadline)
            return await self.guard.run(call, deadline, group, watched=True)
        return await self.guard.run(
            topology.decide(checks, now_ms, usage, usage_ttl_ms), deadline, group
        )

    async def _peek_within(
        self, checks: Sequence[Check], now_ms: int | None, deadline: Deadline | None
    ) -> Verdict:
        return await self.peek(checks, now_ms)

    async def record_usage(
        self, ops: Sequence[UsageOp], ttl_ms: int, now_ms: int | None = None
    ) -> None:
        """Under the store's breaker, like a decision (StoreDown while it is open)."""
        await self.guard.run(record_usage(self.client, ops, ttl_ms), None, op="usage")

    async def usage_value(self, kind: str, key: str) -> int:
        read = self.client.pfcount(key) if kind == "h" else self.client.get(key)
        value = await self.guard.run(read, None, op="usage read")
        return int(value or 0)

    async def peek(self, checks: Sequence[Check], now_ms: int | None = None) -> Verdict:
        """Evaluate without charging (counter queries); one call per slot in Cluster mode.
        Under the breaker that would judge a decision of these checks (a Cluster: their
        masters')."""
        now_ms, group = self._judged(checks, now_ms)
        result: Verdict = await self.guard.run(
            self.topology.peek(checks, now_ms), None, group, op="peek"
        )
        return result

    async def script_call(
        self, script: Any, keys: Sequence[Any], args: Sequence[Any], deadline: Deadline,
        breaker: Breaker | None = None,
    ) -> Any:
        """EVALSHA of `script` (registered on `self.client`) the way decisions go: on the wire
        on standalone and Sentinel, bounded by the pool on Cluster; under `deadline` and the
        store's breaker (`breaker`: a Cluster call's masters). For the frequency counters."""
        topology = self.topology
        if topology.wire is not None:
            call = topology.eval(script, keys, args, deadline)
            return await self.guard.run(call, deadline, breaker, watched=True)
        return await self.guard.run(topology.eval(script, keys, args), deadline, breaker)

    async def load_scripts(self, algorithms: Iterable[str] = ()) -> None:
        """SCRIPT LOAD the lean scripts and the single-algorithm script of each named
        algorithm, so that a process can say it is ready before its first call."""
        for script in self.scripts.preloaded(algorithms):
            await self.client.script_load(script.script)
