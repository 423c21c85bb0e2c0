"""One rls process: its parts (`build_app`), started in order by `Server`, drained on SIGTERM.

`build_app` assembles metrics, the config holder, the store (Redis behind its circuit breaker,
or the bounded memory store), the limiter and the RateLimitService: the whole decision path,
without listeners, so tests and tools build it alone. `Server.run` then loads the config,
connects the store (`start_store`, retried until it accepts us), opens the gRPC and HTTP
listeners, keeps the background loops going (`flush_metrics`, config reloads, --workers health)
and, on SIGTERM, drains in bounded steps.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path

import grpc
from aiohttp import web

from rls.admin.app import AdminState, create_app
from rls.admin.response_cache import add_cache_routes
from rls.admin.switches import follow_shared
from rls.config.errors import ConfigError
from rls.config.model import RateLimitConfig
from rls.config.reload import ConfigHolder, check_config_command
from rls.config.xds.client import XdsConfigSource, start_source
from rls.engine.candidates import CandidateReporter
from rls.engine.limiter import RateLimiter
from rls.engine.top import TopTalkers, dumps_snapshot
from rls.frequency.grpc_api import CountersGrpc
from rls.frequency.model import CountersConfig, load_config
from rls.frequency.service import CountersService
from rls.grpc_access.tls import GrpcTls, add_port, start_tls
from rls.grpc_access.token_auth import interceptors
from rls.observability.metrics import Metrics
from rls.observability.reference_metrics import reference_families
from rls.process.gc_tuning import PauseRecorder, freeze_startup_objects, tune_thresholds
from rls.process.listeners import cannot_listen, start_http
from rls.process.workers import WorkersCollector, mark_ready, watch_supervisor, worker_problem
from rls.response_cache.cache import ResponseCache
from rls.response_cache.store import GuardedStore, StoreError
from rls.services.extproc import EXTPROC_MAX_MESSAGE, build_cache, warn_if_open
from rls.services.health import create_health, health_handler, set_serving
from rls.services.quota import QuotaService
from rls.services.ratelimit import RateLimitService
from rls.settings import Settings
from rls.settings.environment import admin_token, shared_dir
from rls.stores import MemoryBackend, create_backend
from rls.stores.base import Backend, BackendError
from rls.stores.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from rls.stores.deadline import LoopLag
from rls.stores.redis import StoreRejected
from rls.stores.redis.connect import TlsClient
from rls.stores.redis.leases import COUNT_NAMES as LEASE_COUNTS
from rls.stores.redis.urls import redact
from rls.tracing import start_tracing

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
    if settings.reference_metrics:
        metrics.derived.append(reference_families)
    holder = ConfigHolder(
        settings.config,
        metrics,
        settings.merge_domains,
        strict=settings.strict,
        allow_empty=settings.allow_empty_config,
        every_file=settings.config_all_files,
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
            leases=metrics.lease_counts(LEASE_COUNTS) if settings.redis_leases else None,
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


# Every shutdown step is bounded: SIGTERM must end in an exit whatever a library does. A step
# that overruns is logged and left behind; a loop that stops turning is the watchdog's.
SHUTDOWN_STEP_S = 5.0
SHUTDOWN_WATCHDOG_S = 20.0  # beyond the delay and the drain


async def _bounded(what: str, step: Awaitable[object], seconds: float = SHUTDOWN_STEP_S) -> None:
    try:
        async with asyncio.timeout(seconds):
            await step
    except TimeoutError:
        log.error("shutdown: %s still running after %g s; going on without it", what, seconds)


def _shutdown_overran() -> None:
    log.critical("shutdown did not finish in time: exiting now")
    logging.shutdown()
    os._exit(1)


class Server:
    """One rls process, in start-up order: config, store, services, listeners; then the drain.

    Each phase is one method so the order is readable top to bottom in `run`; everything a
    later phase (or the drain) needs is an attribute set by the phase that made it.
    """

    def __init__(self, settings: Settings, ready: asyncio.Event | None = None) -> None:
        self.settings = settings
        self.ready = ready  # set once the process decides from its store (tests, demo)
        self.app = build_app(settings)
        self.pauses = PauseRecorder(
            lambda gen, s: self.app.metrics.gc_pause.labels(str(gen)).observe(s)
        )
        self.store_ready = asyncio.Event()
        self.draining = asyncio.Event()
        self.stop_requested = asyncio.Event()
        self.health = create_health()
        self.cache: ResponseCache | None = None
        self.extproc: grpc.aio.Server | None = None  # ext_proc's own listener, if any
        self.quota: QuotaService | None = None
        self.xds: XdsConfigSource | None = None  # CONFIG_TYPE=GRPC_XDS_SOTW
        self.tls: GrpcTls | None = None  # TLS on every gRPC listener (grpc_access/tls.py), if on
        self.interceptors: list[grpc.aio.ServerInterceptor] = []  # the token check, if set
        self.tasks: list[asyncio.Task[None]] = []
        self._health_tasks: set[asyncio.Task[None]] = set()
        self.tracing = start_tracing(settings, self.app.metrics.registry, self.app.limiter)

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT; 0 after a clean drain, 1 when start-up failed."""
        watch_supervisor()  # a --workers worker drains and exits when its supervisor dies
        tune_thresholds()
        self.pauses.install()
        self._chain_config_hooks()
        self._watch_signals()
        if self.settings.config_type == "GRPC_XDS_SOTW":
            self.xds = await start_source(self.settings, self.app.holder,
                                          self.app.metrics.registry, self.stop_requested)
            if self.stop_requested.is_set() and not self.xds.first.is_set():
                return await self._stop_before_first_config(self.xds)
        elif not self._load_config():
            return 1
        await self._start_store()
        counters = await self._start_counters()
        server = await self._grpc_server(counters)
        if server is None:
            return 1
        await server.start()
        if self.extproc is not None:
            await self.extproc.start()
        runners = await self._start_admin(counters)
        if runners is None:
            await server.stop(grace=None)
            if self.extproc is not None:
                await self.extproc.stop(grace=None)
            return 1
        self._log_listening()
        mark_ready()  # --workers: the supervisor counts this worker's stability from here
        self._start_background()
        await self.stop_requested.wait()
        await self._drain(server, runners, counters)
        return 0

    # -- start-up phases ---------------------------------------------------------------------

    def _chain_config_hooks(self) -> None:
        """On every config change: clear the limiter's caches, freeze the new config's objects
        out of the collector's walk, and let gRPC health follow (NOT_SERVING while no domain is
        loaded: the reference's HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED)."""
        app = self.app
        clear_caches = app.holder.on_change
        loop = asyncio.get_running_loop()

        def config_changed(config: RateLimitConfig) -> None:
            if clear_caches is not None:
                clear_caches(config)
            app.metrics.gc_frozen.set(freeze_startup_objects())
            if not self.draining.is_set() and self.store_ready.is_set():
                task = loop.create_task(set_serving(self.health, self._serving(config)))
                self._health_tasks.add(task)
                task.add_done_callback(self._health_tasks.discard)

        app.holder.on_change = config_changed

    def _load_config(self) -> bool:
        """Same rule as a reload: one bad file rejects the whole load. Fail fast: a service with
        no limits would answer OK to everything."""
        app, settings = self.app, self.settings
        fatal = not settings.allow_empty_config
        if not app.holder.reload(log_error=not fatal) and fatal:
            # One line: every problem with its location, and the command that checks again.
            log.error("cannot start: the config does not load: %s (every problem: %s)",
                      app.holder.last_error, check_config_command(
                          settings.config, settings.merge_domains, settings.strict,
                          settings.config_all_files))
            return False
        app.holder.start(settings.reload_interval)
        return True

    async def _start_store(self) -> None:
        """Open the store's connections before the port opens (one attempt; retries go on in
        the background), so a burst at a cold start meets loaded scripts."""
        self.app.metrics.store_ready.set(0)
        attempted = asyncio.Event()
        self.tasks.append(asyncio.get_running_loop().create_task(
            start_store(self.app, self.store_ready, attempted)
        ))
        self.app.limiter.lag.start()
        await attempted.wait()

    async def _start_counters(self) -> CountersService:
        settings, app = self.settings, self.app
        try:
            counters_cfg = (
                load_config(settings.counters_config)
                if settings.counters_config
                else CountersConfig()
            )
        except ValueError as exc:
            raise SystemExit(f"rls: {exc}") from None
        counters = CountersService.for_backend(
            app.backend, counters_cfg, app.metrics.registry, settings.key_prefix
        )
        await counters.start()
        return counters

    async def _grpc_server(self, counters: CountersService) -> grpc.aio.Server | None:
        """Every gRPC service on one port: RateLimitService, RLQS, counters and health
        (NOT_SERVING until the store accepted us); ext_proc (with a cache config) on a listener
        of its own (`self.extproc`), or on this one when --extproc-addr equals --grpc-addr."""
        settings, app = self.settings, self.app
        self.tls = start_tls(settings, app.metrics.registry)  # SystemExit naming a bad file
        self.interceptors = interceptors(settings.grpc_token, app.metrics.registry)
        try:
            self.quota = QuotaService(
                app.holder.current, app.backend, settings, app.metrics.registry,
                candidates=CandidateReporter(
                    app.metrics, app.limiter.top, settings.near_limit_ratio
                ),
            )
        except ValueError as exc:
            raise SystemExit(f"rls: {exc}") from None
        handlers = [
            app.service.handler(), self.quota.handler(), CountersGrpc(counters).handler()
        ]
        # grpc's own cap sits above ours, so an oversized request gets rls's INVALID_ARGUMENT
        # with a message rather than grpc's RESOURCE_EXHAUSTED; beyond it grpc still protects
        # memory. An RLQS report lists every bucket of an Envoy (up to 20,000, ~80 bytes each).
        max_message = max(settings.max_request_bytes * 4 + 65536, 4 << 20)
        if settings.cache_config:
            try:
                extproc, self.cache = build_cache(
                    settings.cache_config, settings.cache_store or None, app.metrics.registry
                )
            except ConfigError as exc:
                raise SystemExit(f"rls: {exc}") from None
            await probe_cache_store(self.cache.store)
            if settings.extproc_addr == settings.grpc_addr:
                handlers.append(extproc.handler())
                max_message = max(max_message, EXTPROC_MAX_MESSAGE)
            else:
                self.extproc = self._grpc_listener(
                    settings.extproc_addr, "ext_proc", EXTPROC_MAX_MESSAGE, (extproc.handler(),)
                )
                if self.extproc is None:
                    return None
            warn_if_open(settings.extproc_addr, bool(settings.grpc_token))
        server = self._grpc_listener(settings.grpc_addr, "gRPC", max_message, tuple(handlers))
        if server is not None:
            await set_serving(self.health, False)  # until the store accepted us
            server.add_generic_rpc_handlers((health_handler(self.health),))
        return server

    def _grpc_listener(
        self, addr: str, what: str, max_message: int, handlers: tuple[grpc.GenericRpcHandler, ...]
    ) -> grpc.aio.Server | None:
        """A grpc.aio server on `addr` with the token check and the stream cap; None (logged)
        when the address cannot be bound."""
        settings = self.settings
        server = grpc.aio.server(
            interceptors=self.interceptors,
            options=[
                ("grpc.max_receive_message_length", max_message),
                ("grpc.max_concurrent_streams", settings.max_concurrent_streams),
                # Shared ports only for --workers: otherwise a second rls on the port must fail.
                ("grpc.so_reuseport", 1 if shared_dir() is not None else 0),
            ],
        )
        if self.tracing is not None:  # chosen once: the plain handlers carry no tracing
            handlers = self.tracing.instrument(handlers)
        server.add_generic_rpc_handlers(self.tls.guard(handlers) if self.tls else handlers)
        try:
            port = add_port(server, addr, self.tls)
        except RuntimeError as exc:  # grpc raises when the address is taken
            port = 0
            log.error("%s", cannot_listen(addr, what, exc))
        return server if port else None

    async def _start_admin(self, counters: CountersService) -> list[web.AppRunner] | None:
        settings, app = self.settings, self.app
        self.state = AdminState(app.service, app.metrics, app.holder.current)
        self.state.store_ready = False
        self.state.require_domain = settings.healthy_with_at_least_one_config_loaded
        self.state.worker_problem = worker_problem  # --workers: the sibling slots
        if self.xds is not None:
            self.state.config_source = self.xds.status
        self.state.counters = counters  # type: ignore[attr-defined]  # read by admin/frequency.py
        admin_app = create_app(self.state)
        if not settings.admin_read_only:
            add_cache_routes(admin_app, self.cache)  # without a cache: 404s that say so
        runners = await start_http(admin_app, self.state, settings, shared_dir() is not None)
        if runners is not None and admin_token() is not None:
            log.info("admin token on: mutating admin endpoints and /json need the bearer token")
        return runners

    def _log_listening(self) -> None:
        log.info(
            "rls serving gRPC on %s, admin on %s, backend %s, %s loop%s",
            self.settings.grpc_addr,
            self.settings.http_addr + " (read-only)" * self.settings.admin_read_only,
            self.app.backend.name,
            "uvloop" if "uvloop" in type(asyncio.get_running_loop()).__module__ else "asyncio",
            "" if self.cache is None else
            f", response cache (ext_proc) on {self.settings.extproc_addr}",
        )

    def _start_background(self) -> None:
        loop = asyncio.get_running_loop()
        app = self.app
        self.tasks += [
            loop.create_task(follow_shared(self.settings, app.metrics)),
            loop.create_task(flush_metrics(app.metrics, app.limiter.top)),
            loop.create_task(self._become_ready()),
            loop.create_task(app.limiter.sweep_reservations()),
        ]
        if shared_dir() is not None:
            self.tasks.append(loop.create_task(self._follow_workers()))
        if self.tls is not None:
            self.tasks.append(loop.create_task(self.tls.watch()))

    def _watch_signals(self) -> None:
        """SIGTERM/SIGINT ask for the drain from the start: one that comes while start-up
        still waits (the first xDS config, the store's first attempt) must not kill the
        process by the signal's default action, leaving streams and logs unclosed."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_requested.set)

    async def _stop_before_first_config(self, source: XdsConfigSource) -> int:
        """SIGTERM before the first xDS config: nothing listens yet, so there is nothing to
        drain; close the stream and exit 0, as after a drain."""
        await _bounded("the xDS client", source.stop())
        self.pauses.uninstall()
        log.info("stopped before the first xDS config arrived")
        return 0

    def _serving(self, config: RateLimitConfig | None) -> bool:
        """gRPC health's answer, as /healthcheck's: a domain loaded (over xDS: a config in
        force, unless HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, as the reference) and, under
        --workers, no sibling worker slot failing (draining and the store are the callers')."""
        domain_needed = (self.settings.healthy_with_at_least_one_config_loaded
                         or self.settings.config_type == "FILE")
        loaded = has_config(config) if domain_needed else config is not None
        return loaded and worker_problem() is None

    async def _follow_workers(self) -> None:
        """--workers: gRPC health follows the supervisor's slots (checked every second)."""
        failing = False
        while True:
            await asyncio.sleep(1.0)
            if (worker_problem() is not None) == failing:
                continue
            failing = not failing
            if not self.draining.is_set() and self.store_ready.is_set():
                await set_serving(self.health, self._serving(self.app.holder.current()))

    async def _become_ready(self) -> None:
        """Health says SERVING only once the store accepted us (and never while draining)."""
        await self.store_ready.wait()
        self.app.metrics.gc_frozen.set(freeze_startup_objects())
        if not self.state.draining:
            self.state.store_ready = True
            await set_serving(self.health, self._serving(self.app.holder.current()))
            if self.ready is not None:
                self.ready.set()

    # -- the drain -----------------------------------------------------------------------------

    async def _drain(
        self, server: grpc.aio.Server, runners: list[web.AppRunner], counters: CountersService
    ) -> None:
        app, settings = self.app, self.settings
        log.info("shutting down: draining in-flight calls")
        watchdog = threading.Timer(
            settings.shutdown_delay_ms / 1000 + settings.drain_seconds + SHUTDOWN_WATCHDOG_S,
            _shutdown_overran,
        )
        watchdog.daemon = True
        watchdog.start()
        self.state.draining = True
        self.draining.set()
        await set_serving(self.health, False)
        # Quota streams end now, not after the grace: Envoy's next report (≤ 5 s) goes to a live
        # rls, and nothing is granted from here on (their reservations are given back).
        if self.quota is not None:
            await _bounded("the quota streams", self.quota.drain())
        # Keep answering for a moment while readiness reports 503: grpc-core cancels calls it
        # has received but not yet handed to a handler when stop() begins (grpc/grpc#41785),
        # and load balancers need a moment to notice the readiness change.
        await asyncio.sleep(settings.shutdown_delay_ms / 1000)
        stops = [server.stop(grace=settings.drain_seconds)]
        if self.extproc is not None:
            stops.append(self.extproc.stop(grace=settings.drain_seconds))
        await _bounded("the gRPC server's stop", asyncio.gather(*stops),
                       settings.drain_seconds + SHUTDOWN_STEP_S)
        if self.cache is not None:
            # lets pending stores finish (bounded), closes the store
            await _bounded("the response cache", self.cache.close())
        await _bounded("the counters service", counters.close())
        for task in self.tasks:
            task.cancel()
        app.limiter.lag.stop()
        if app.limiter.decisions is not None:
            await _bounded("the decision log", asyncio.to_thread(app.limiter.decisions.close))
        self.pauses.uninstall()
        app.metrics.flush()
        await _bounded("the config watcher", app.holder.stop())
        if self.xds is not None:
            await _bounded("the xDS client", self.xds.stop())
        for runner in runners:  # the admin listener, the Prometheus one
            await _bounded("an HTTP listener", runner.cleanup())
        await _bounded("the store", app.backend.close())
        if self.tracing is not None:  # the spans still queued, if the collector takes them
            await _bounded("the span export", asyncio.to_thread(self.tracing.flush, 2.0))
        watchdog.cancel()
        log.info("stopped")


async def serve(settings: Settings, ready: asyncio.Event | None = None) -> int:
    """Run one rls process until SIGTERM/SIGINT (see `Server`)."""
    return await Server(settings, ready).run()
