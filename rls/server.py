"""Wire config, backend, limiter, gRPC and admin HTTP into one process; drain on SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

import grpc
from aiohttp import web
from grpc_health.v1 import health_pb2_grpc

from rls.admin.app import RUNNER_OPTIONS, AdminState, create_app
from rls.admin.cache import add_cache_routes
from rls.admin.switches import follow_shared
from rls.backends import create_backend
from rls.backends.base import Backend, BackendError
from rls.backends.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from rls.cache import build_cache
from rls.config.errors import ConfigError
from rls.config.reload import ConfigHolder
from rls.engine.limiter import RateLimiter
from rls.grpc_auth import interceptors
from rls.metrics import Metrics
from rls.services.health import create_health, set_serving
from rls.services.ratelimit import RateLimitService
from rls.settings import Settings
from rls.workers import shared_dir, watch_supervisor

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
    holder = ConfigHolder(settings.config, metrics, settings.merge_domains)
    if backend is None and settings.redis_url:
        gauge = metrics.circuit.labels("redis")
        breaker = CircuitBreaker(
            "redis",
            threshold=settings.breaker_threshold,
            cooldown=settings.breaker_cooldown_ms / 1000,
            on_change=lambda state: gauge.set(_CIRCUIT_VALUE[state]),
        )
        backend = create_backend(
            settings.redis_url,
            timeout_ms=max(settings.backend_timeout_ms, 1),
            breaker=breaker,
            auto_pipeline=settings.auto_pipeline,
        )
    elif backend is None:
        backend = create_backend(None)
    limiter = RateLimiter(holder.current, backend, settings, metrics)
    holder.on_change = lambda _config: limiter.clear_local_cache()
    service = RateLimitService(limiter, settings, metrics)
    return App(settings, metrics, holder, backend, limiter, service)


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


async def _flush_metrics(metrics: Metrics, interval: float = 1.0) -> None:
    """Push buffered counts into the counters (other workers' /metrics read them from files)."""
    while True:
        await asyncio.sleep(interval)
        metrics.flush()


async def serve(settings: Settings, ready: asyncio.Event | None = None) -> int:
    watch_supervisor()  # a --workers worker drains and exits when its supervisor dies
    app = build_app(settings)
    if not app.holder.reload():  # same rule as a reload: one bad file rejects the whole load
        log.error("cannot start: configuration failed to load: %s", app.holder.last_error)
        return 1
    app.holder.start(settings.reload_interval)
    try:
        await app.backend.start()
    except BackendError as exc:
        log.warning("%s (failure mode %s applies until it answers)", exc, settings.failure_mode)

    handlers = [app.service.handler()]
    cache = None
    # grpc's own cap sits above ours, so an oversized request gets rls's INVALID_ARGUMENT with
    # a message rather than grpc's RESOURCE_EXHAUSTED; beyond it grpc still protects memory.
    max_message = settings.max_request_bytes * 4 + 65536
    if settings.cache_config:
        try:
            extproc, cache = build_cache(
                settings.cache_config, settings.cache_store or None, app.metrics.registry
            )
        except ConfigError as exc:
            raise SystemExit(f"rls: {exc}") from None
        handlers.append(extproc.handler())
        # Buffered bodies arrive in one message; RateLimitService checks its own size limit.
        max_message = max(max_message, 16 << 20)
    server = grpc.aio.server(
        interceptors=interceptors(settings.grpc_token),
        options=[
            ("grpc.max_receive_message_length", max_message),
            # Shared ports only for --workers: otherwise a second rls on the same port must fail.
            ("grpc.so_reuseport", 1 if shared_dir() is not None else 0),
        ]
    )
    server.add_generic_rpc_handlers(tuple(handlers))
    health = create_health()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    try:
        port = server.add_insecure_port(settings.grpc_addr)
    except RuntimeError as exc:  # grpc raises when the address is taken
        port = 0
        log.error("cannot listen on %s (gRPC): %s", settings.grpc_addr, exc)
    if port == 0:
        return 1
    await server.start()
    await set_serving(health, True)

    state = AdminState(app.service, app.metrics, app.holder.current)
    admin_app = create_app(state)
    if cache is not None:
        add_cache_routes(admin_app, cache)
    runner = web.AppRunner(admin_app, access_log=None, **RUNNER_OPTIONS)
    await runner.setup()
    host, http_port = split_addr(settings.http_addr)
    site = web.TCPSite(runner, host, http_port, reuse_port=shared_dir() is not None)
    try:
        await site.start()
    except OSError as exc:
        log.error("cannot listen on %s (admin): %s", settings.http_addr, exc)
        await server.stop(grace=None)
        return 1
    log.info(
        "rls serving gRPC on %s, admin on %s, backend %s%s",
        settings.grpc_addr,
        settings.http_addr,
        app.backend.name,
        ", response cache on" if cache is not None else "",
    )

    follower = asyncio.get_running_loop().create_task(follow_shared(settings, app.metrics))
    flusher = asyncio.get_running_loop().create_task(_flush_metrics(app.metrics))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    await stop.wait()

    log.info("shutting down: draining in-flight calls")
    state.draining = True
    await set_serving(health, False)
    # Keep answering for a moment while readiness reports 503: grpc-core cancels calls it has
    # received but not yet handed to a handler when stop() begins (grpc/grpc#41785), and load
    # balancers need a moment to notice the readiness change.
    await asyncio.sleep(settings.shutdown_delay_ms / 1000)
    await server.stop(grace=settings.drain_seconds)
    if cache is not None:
        await cache.close()  # lets pending stores finish (bounded), closes the store
    follower.cancel()
    flusher.cancel()
    app.metrics.flush()
    await app.holder.stop()
    await runner.cleanup()
    await app.backend.close()
    log.info("stopped")
    return 0
