"""The parts of one rls process, and the loops that keep them going.

build_app assembles metrics, the config holder, the store (Redis behind its circuit breaker,
or the bounded memory store), the limiter and the RateLimitService: the whole decision path,
without listeners, so tests and tools build it alone. start_store connects the store until it
accepts us, flush_metrics pushes buffered counts; rls.server runs them in start-up order.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from rls.config.model import RateLimitConfig
from rls.config.reload import ConfigHolder
from rls.engine.limiter import RateLimiter
from rls.engine.top import TopTalkers, dumps_snapshot
from rls.metrics import Metrics
from rls.response_cache.store import GuardedStore, StoreError
from rls.services.ratelimit import RateLimitService
from rls.settings import Settings, shared_dir
from rls.stores import MemoryBackend, create_backend
from rls.stores.base import Backend, BackendError
from rls.stores.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from rls.stores.deadline import LoopLag
from rls.stores.redis import StoreRejected
from rls.stores.redis.connect import TlsClient
from rls.stores.redis.urls import redact
from rls.workers import WorkersCollector

log = logging.getLogger("rls.server")

_CIRCUIT_VALUE = {CLOSED: 0.0, OPEN: 1.0, HALF_OPEN: 0.5}


@dataclass
class App:
    settings: Settings
    metrics: Metrics
    holder: ConfigHolder
    backend: Backend
    limiter: RateLimiter
    service: RateLimitService


def build_app(settings: Settings, backend: Backend | None = None) -> App:
    metrics = Metrics(near_ratio=settings.near_limit_ratio)
    holder = ConfigHolder(
        settings.config,
        metrics,
        settings.merge_domains,
        strict=settings.strict,
        allow_empty=settings.allow_empty_config,
    )
    if backend is None and settings.redis_url:
        gauge = metrics.circuit.labels("redis")
        breaker = CircuitBreaker(
            "redis",
            threshold=settings.breaker_threshold,
            probe_interval=settings.probe_interval_ms / 1000,
            on_change=lambda state: gauge.set(_CIRCUIT_VALUE[state]),
        )
        backend = create_backend(
            settings.redis_url,
            timeout_ms=max(settings.backend_timeout_ms, 1),
            breaker=breaker,
            auto_pipeline=settings.auto_pipeline,
            probe_timeout_ms=settings.probe_timeout_ms,
            tls=TlsClient(
                settings.redis_tls_client_cert, settings.redis_tls_client_key,
                settings.redis_tls_cacert, settings.redis_tls_skip_hostname_verification,
            ),
        )
    elif backend is None:
        memory = MemoryBackend(
            max_bytes=settings.memory_max_bytes, on_evict=metrics.memory_evictions.inc
        )
        metrics.memory_bytes.set_function(lambda: memory.nbytes)
        backend = memory
    if shared_dir() is not None:  # a --workers worker: the supervisor's slots on /metrics
        metrics.process_collectors.append(WorkersCollector())
    lag = LoopLag(observe=metrics.loop_lag.observe)
    limiter = RateLimiter(holder.current, backend, settings, metrics, lag)
    holder.on_change = lambda _config: limiter.clear_local_cache()
    service = RateLimitService(limiter, settings, metrics)
    return App(settings, metrics, holder, backend, limiter, service)


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


async def flush_metrics(
    metrics: Metrics, top: TopTalkers | None = None, interval: float = 1.0
) -> None:
    """Push buffered counts into the counters (other workers' /metrics read them from files),
    and, under --workers, this worker's top talkers for the others' /top."""
    shared = shared_dir()
    path = None if shared is None or top is None else Path(shared) / f"top-{os.getpid()}.json"
    while True:
        await asyncio.sleep(interval)
        metrics.flush()
        if path is not None and top is not None:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(dumps_snapshot(top))
            tmp.replace(path)  # readers never see a half-written file


async def start_store(app: App, on_ready: asyncio.Event, attempted: asyncio.Event) -> None:
    """Connect, check and warm the store until it accepts us; then set `on_ready`.

    `attempted` is set after the first attempt, whatever its outcome: the gRPC port opens only
    then, so a burst at a cold start meets open connections and loaded scripts. Until the store
    accepts us, calls are answered by the failure mode at once (breaker open) and health says
    NOT_SERVING; the reason is logged (at most every 10 s while it lasts)."""
    backend = app.backend
    last_log = 0.0
    loop = asyncio.get_running_loop()
    while True:
        try:
            await backend.start()
        except StoreRejected as exc:
            why, level = str(exc), logging.ERROR
        except BackendError as exc:
            why, level = str(exc), logging.WARNING
        else:
            app.metrics.store_ready.set(1)
            log.info("store %s ready", backend.name)
            on_ready.set()
            attempted.set()
            return
        breaker = getattr(backend, "breaker", None)
        if breaker is not None:
            breaker.open(why)
        if loop.time() - last_log >= 10:
            log.log(level, "not ready: %s (retrying; failure mode %s answers meanwhile)",
                    why, app.settings.failure_mode)
            last_log = loop.time()
        attempted.set()
        await asyncio.sleep(0.25)


def has_config(config: RateLimitConfig | None) -> bool:
    return config is not None and bool(config.domains)


async def probe_cache_store(store: GuardedStore) -> None:
    """Report an unreachable cache store at startup (requests still go upstream uncached)."""
    try:
        await store.get_version("rls:startup-probe")
    except StoreError as exc:
        log.warning(
            "cache store %s unreachable at startup: %s; requests go upstream uncached "
            "until it answers",
            redact(getattr(store, "url", store.name)),  # never the store's password
            exc,
        )
