"""The xDS client: one ADS State-of-the-World stream for the reference's RateLimitConfig
resources (CONFIG_TYPE=GRPC_XDS_SOTW), as envoyproxy/ratelimit's xds_grpc_sotw_provider.go.

Every response holds the whole set; it is built into one config off the event loop (the file
loader's budgets, rls.config.reload.in_daemon_thread) and swapped in through the ConfigHolder
like a file reload (over-limit cache cleared, health, reload metrics); counters are untouched.
Then the response is ACKed (its version and nonce) or, when the set does not build, NACKed
(the last accepted version, its nonce, and the loader's one-line error) and the config in
force stays. A set identical to the one in force is ACKed without rebuilding it; one
identical to the last refused set is NACKed again without rebuilding or logging it (a
controller resending a bad set costs one build, not one per response).

Responses are handled one at a time: a server that pushes faster than sets build is slowed by
gRPC's flow control, never buffered here. A response over the size cap ends the stream (gRPC
refuses it before it is read); a lost stream keeps the config in force and is reopened after
a jittered exponential back-off (a failed connect: after the connect retry interval).
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import struct_pb2
from google.rpc import status_pb2
from prometheus_client import CollectorRegistry, Counter, Gauge

from rls import __version__
from rls.config.errors import ConfigError
from rls.config.loader import LoadBudget
from rls.config.model import RateLimitConfig
from rls.config.reload import ConfigHolder, in_daemon_thread, one_line
from rls.config.xds.convert import (
    RESPONSE,
    TYPE_URL,
    XdsResponseError,
    YieldingBudget,
    build_config,
)
from rls.config.xds.options import Backoff
from rls.config.xds.problems import classify, explain, unreadable
from rls.event_loop import cancel_and_wait
from rls.settings import Settings
from rls.settings.forms import parse_pairs, stream_headers

log = logging.getLogger("rls.config.xds")

LABEL = "xds"  # rls_config_last_load_error{file} of a refused set
DEFAULT_MAX_MSG_BYTES = 4 << 20  # gRPC's default receive limit (XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES=0)
KEEPALIVE_MS = 30_000  # a silent dead connection is noticed within about 40 s
KEEPALIVE_TIMEOUT_MS = 10_000
RETRY_LOG_SECONDS = 60.0  # the same reconnect problem is logged again after this long
MAX_VERSION_CHARS = 128  # of the version label and /rlconfig (a server chooses the text)
NACK_REASONS = ("type_url", "decode", "too_large", "invalid", "timeout")
RECONNECT_REASONS = ("connect_failed", "stream_lost", "response_too_large")
INVALID_ARGUMENT = 3  # google.rpc.Code of a NACK's error_detail
# While a set builds, the event loop waits for the GIL at most this long (Python's default is
# 5 ms): every decision needs the GIL a few times, and a build can hold the CPU for seconds.
BUILD_SWITCH_INTERVAL = 0.0005


class XdsMetrics:
    """rls_xds_* series (docs/metrics.md): stream state, version in force, ACKs, NACKs by
    reason, reconnects by reason. Every label set is closed except `version`, of which one
    series exists at a time."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.connected = Gauge(
            "rls_xds_connected", "1 while the stream to the xDS management server is open",
            registry=registry, multiprocess_mode="livemax",
        )
        self.version = Gauge(
            "rls_xds_config_version_info",
            "The xDS version in force (label version; value always 1): the control plane's "
            "opaque string, not a number, compared only for equality",
            ["version"], registry=registry, multiprocess_mode="livemax",
        )
        self.acks = Counter("rls_xds_acks", "xDS responses accepted (ACKed)", registry=registry)
        self.nacks = Counter(
            "rls_xds_nacks", "xDS responses refused (NACKed) by reason", ["reason"],
            registry=registry,
        )
        self.reconnects = Counter(
            "rls_xds_reconnects", "xDS streams reopened, by what ended the previous one",
            ["reason"], registry=registry,
        )
        for reason in NACK_REASONS:
            self.nacks.labels(reason)
        for reason in RECONNECT_REASONS:
            self.reconnects.labels(reason)
        self._version: str | None = None

    def set_version(self, version: str) -> None:
        if self._version is not None:
            self.version.remove(self._version)
        self._version = version
        self.version.labels(version).set(1)


def _digest(resources: Any) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    for resource in resources:
        digest.update(resource.type_url.encode())
        digest.update(len(resource.value).to_bytes(8, "little"))
        digest.update(resource.value)
    return digest.digest()


class TlsFileError(Exception):
    """A TLS file of the xDS client that cannot be read (its message names the setting)."""


class XdsConfigSource:
    """Keeps the stream open for the life of the process and feeds `holder`."""

    def __init__(
        self, settings: Settings, holder: ConfigHolder, registry: CollectorRegistry
    ) -> None:
        self.settings = settings
        self.holder = holder
        self.metrics = XdsMetrics(registry)
        self.headers, dropped = stream_headers(settings.xds_additional_headers)
        if dropped:
            log.warning("xDS: CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: %s not sent (gRPC "
                        "sets these itself)", ", ".join(dropped))
        self.first = asyncio.Event()  # set when a config is first accepted
        self.version = ""  # of the set in force ("" before the first)
        self.accepted_at: float | None = None
        self.last_nack: dict[str, object] | None = None
        # What ended the last stream ({error, at}) until a connection succeeds; then it moves
        # to previous_stream_error (with cleared_at), so a healthy stream shows no error.
        self.last_stream_error: dict[str, str | None] | None = None
        self.previous_stream_error: dict[str, str | None] | None = None
        self._problem = ""  # what the retry log repeats, without gRPC's variable words
        self.connected = False
        self._digest: bytes | None = None
        # The last set refused by its build and why: resent, it is NACKed at once, unlogged.
        self._refused: tuple[bytes, ConfigError] | None = None
        self._logged: tuple[object, float] = (None, 0.0)  # last retry warning, when
        self._task: asyncio.Task[None] | None = None

    # -- life cycle ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        self._set_connected(False)

    def status(self) -> dict[str, object]:
        """The source's state for /rlconfig?format=json."""
        return {
            "type": "GRPC_XDS_SOTW",
            "server": self.settings.xds_server_url,
            "node_id": self.settings.xds_node_id,
            "connected": self.connected,
            "version": self.version[:MAX_VERSION_CHARS] if self.accepted_at is not None else None,
            "accepted_at": _iso(self.accepted_at),
            "last_nack": self.last_nack,
            "last_stream_error": self.last_stream_error,
            "previous_stream_error": self.previous_stream_error,
        }

    async def _run(self) -> None:
        settings = self.settings
        backoff = Backoff(
            settings.xds_backoff_initial, settings.xds_backoff_max,
            settings.xds_backoff_random_factor, settings.xds_backoff_jitter,
        )
        connect = Backoff(settings.xds_connect_retry_interval,
                          settings.xds_connect_retry_interval, 0.5, True)
        log.info("xDS: connecting to %s as node %r", settings.xds_server_url,
                 settings.xds_node_id)
        while True:
            try:
                reason, answered = await self._session()
            except Exception as exc:  # a client bug must not end config updates for good
                reason, answered = "stream_lost", False
                self._failed(one_line(f"unexpected {type(exc).__name__}: {exc}"))
                log.error("xDS: %s", self._problem)
            if answered:
                backoff.reset()
            delay = connect.next() if reason == "connect_failed" else backoff.next()
            self.metrics.reconnects.labels(reason).inc()
            self._log_retry(reason, delay)
            await asyncio.sleep(delay)

    def _log_retry(self, reason: str, delay: float) -> None:
        """One warning per new problem, repeated at most every RETRY_LOG_SECONDS while it
        lasts (a server down for an hour is not 1,200 identical lines). A problem is its
        explanation, not gRPC's words, which change from attempt to attempt (the address)."""
        now = time.monotonic()
        problem = (reason, self._problem)
        if problem == self._logged[0] and now - self._logged[1] < RETRY_LOG_SECONDS:
            return
        self._logged = (problem, now)
        error = (self.last_stream_error or {}).get("error") or self._problem
        log.warning("xDS: %s: %s; %s; retrying in %.1f s (logged again in %d s if it lasts)",
                    reason.replace("_", " "), error, self._in_force(), delay,
                    RETRY_LOG_SECONDS)

    def _in_force(self) -> str:
        """What rls answers while the stream is down."""
        if self.accepted_at is not None:
            return f"keeping the config in force (version {self.version[:MAX_VERSION_CHARS]!r})"
        if self.settings.force_start_without_initial_config:
            return ("no config in force yet: every call is answered OK (no domain) until the "
                    "first arrives")
        return ("no config yet: rls opens its listeners once the first arrives "
                "(FORCE_START_WITHOUT_INITIAL_CONFIG=true serves at once, every call OK)")

    def _failed(self, problem: str, grpc_text: str = "") -> None:
        """Record what ended a stream (or a connect): `problem` as rls explains it, gRPC's own
        words after it when they add something."""
        self._problem = problem
        error = f"{problem} (gRPC: {grpc_text})" if grpc_text else problem
        self.last_stream_error = {"error": error, "at": _iso(time.time())}

    # -- one stream ----------------------------------------------------------------------------

    def _channel(self) -> grpc.aio.Channel:
        settings = self.settings
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length",
             settings.xds_max_msg_bytes or DEFAULT_MAX_MSG_BYTES),
            ("grpc.keepalive_time_ms", KEEPALIVE_MS),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            ("grpc.primary_user_agent", f"rls/{__version__}"),
        ]
        if not settings.xds_server_use_tls:
            return grpc.aio.insecure_channel(settings.xds_server_url, options=options)
        if settings.xds_server_tls_san:
            options.append(("grpc.ssl_target_name_override", settings.xds_server_tls_san))
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self._read("xds_server_tls_cacert"),
            private_key=self._read("xds_client_tls_key"),
            certificate_chain=self._read("xds_client_tls_cert"),
        )
        return grpc.aio.secure_channel(settings.xds_server_url, credentials, options=options)

    def _read(self, name: str) -> bytes | None:
        """The PEM file of setting `name` (None when unset); TlsFileError naming the setting."""
        path = getattr(self.settings, name)
        if not path:
            return None
        try:
            with open(path, "rb") as fh:
                return fh.read()
        except OSError as exc:
            raise TlsFileError(unreadable(self.settings, name, exc)) from None

    async def _session(self) -> tuple[str, bool]:
        """One stream until it ends: (why it ended, whether it delivered a response)."""
        answered = False
        try:
            channel = self._channel()  # reads the certificate files: rotated ones are used
        except TlsFileError as exc:
            self._failed(str(exc))
            return "connect_failed", False
        watcher: asyncio.Task[None] | None = None
        try:
            stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
            call = stub.StreamAggregatedResources(metadata=self.headers)
            await call.write(self._request())
            watcher = asyncio.get_running_loop().create_task(self._watch_ready(channel))
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    self._failed("the server ended the stream")
                    return "stream_lost", answered
                answered = True
                await call.write(await self._handle(response))
        except grpc.aio.AioRpcError as exc:
            said = one_line(f"{exc.code().name}: {exc.details()}")
            connecting = exc.code() == grpc.StatusCode.UNAVAILABLE and not self.connected
            kind = classify(exc.details() or "") if connecting else None
            if kind is None:
                self._failed(said)
            else:
                self._failed(explain(self.settings, kind, exc.details() or ""), said)
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                return "response_too_large", answered
            if connecting:
                return "connect_failed", answered
            return "stream_lost", answered
        finally:
            if watcher is not None:
                watcher.cancel()
            self._set_connected(False)
            await channel.close(grace=None)

    async def _watch_ready(self, channel: grpc.aio.Channel) -> None:
        await channel.channel_ready()
        self._set_connected(True)
        if self.last_stream_error is not None:  # resolved: kept, dated, as the previous one
            cleared = {"cleared_at": _iso(time.time())}
            self.previous_stream_error = {**self.last_stream_error, **cleared}
            self.last_stream_error = None
        log.info("xDS: connected to %s", self.settings.xds_server_url)

    def _set_connected(self, connected: bool) -> None:
        self.connected = connected
        self.metrics.connected.set(1 if connected else 0)

    def _request(
        self, version: str = "", nonce: str = "", error: str | None = None
    ) -> discovery_pb2.DiscoveryRequest:
        settings = self.settings
        metadata = struct_pb2.Struct()
        metadata.update(parse_pairs(settings.xds_node_metadata, "=:"))
        request = discovery_pb2.DiscoveryRequest(
            version_info=version,
            node=base_pb2.Node(
                id=settings.xds_node_id, metadata=metadata,
                user_agent_name="rls", user_agent_version=__version__,
            ),
            type_url=TYPE_URL,
            response_nonce=nonce,
        )
        if error is not None:
            request.error_detail.CopyFrom(status_pb2.Status(code=INVALID_ARGUMENT, message=error))
        return request

    # -- one response --------------------------------------------------------------------------

    async def _handle(self, response: Any) -> discovery_pb2.DiscoveryRequest:
        """Build, swap in and ACK the response's set, or NACK it keeping the config in force."""
        version = response.version_info[:MAX_VERSION_CHARS]
        if response.type_url != TYPE_URL:
            error: ConfigError = XdsResponseError(
                RESPONSE, f"unexpected type_url '{response.type_url[:200]}', "
                f"expected '{TYPE_URL}'", "type_url",
            )
            return self._nack(response, error)
        resources = list(response.resources)
        budget = YieldingBudget()
        limit = budget.load_seconds + 5.0  # the build stops itself at load_seconds
        try:
            digest, built = await in_daemon_thread(
                lambda: self._build(resources, budget), limit
            )
        except TimeoutError:
            built = XdsResponseError(
                RESPONSE, f"config build did not finish within {limit:g} s", "timeout"
            )
            digest = None
        if isinstance(built, ConfigError):
            repeat = self._refused is not None and self._refused[0] == digest
            # Not a refusal for time: on a less busy moment the same set may build.
            if digest is not None and time.monotonic() < budget.started + budget.load_seconds:
                self._refused = (digest, built)
            return self._nack(response, built, log_it=not repeat)
        if digest != self._digest and built is not None:
            self.holder.apply(built, LABEL)
        else:  # the set in force, sent again: a refusal in between no longer stands
            self.holder.clear_errors()
        self._digest, self._refused = digest, None
        self.version = response.version_info
        self.accepted_at = time.time()
        self.metrics.set_version(version)
        self.metrics.acks.inc()
        self.first.set()
        return self._request(response.version_info, response.nonce)

    def _build(
        self, resources: list[Any], budget: LoadBudget
    ) -> tuple[bytes, RateLimitConfig | ConfigError | None]:
        """In a worker thread: (digest of the set, its config — None when it is the set in
        force — or the error that refuses it)."""
        digest = _digest(resources)
        if digest == self._digest:
            return digest, None
        if self._refused is not None and self._refused[0] == digest:
            return digest, self._refused[1]
        try:
            config = _without_collector(
                lambda: build_config(resources, self.settings.merge_domains, budget)
            )
        except ConfigError as exc:
            return digest, exc
        except Exception as exc:  # a loader bug: one line, never a traceback, keep serving
            return digest, ConfigError(RESPONSE, f"unexpected {type(exc).__name__}: {exc}")
        for warning in config.warnings:
            log.warning("%s", warning)
        if self.holder.strict and config.warnings:
            return digest, config.warnings[0].as_error()
        return digest, config

    def _nack(
        self, response: Any, error: ConfigError, log_it: bool = True
    ) -> discovery_pb2.DiscoveryRequest:
        """NACK `response`; `log_it` False for a resent refused set (said once already)."""
        reason = error.reason if isinstance(error, XdsResponseError) else "invalid"
        if log_it:
            self.holder.apply(error, LABEL)  # logs it; rls_config_loads{result="error"}
        detail = one_line(error.detail())
        self.metrics.nacks.labels(reason).inc()
        self.last_nack = {
            "version": response.version_info[:MAX_VERSION_CHARS],
            "nonce": response.nonce[:MAX_VERSION_CHARS],
            "reason": reason,
            "error": detail,
            "at": _iso(time.time()),
        }
        return self._request(self.version, response.nonce, detail)


def _without_collector(build: Callable[[], RateLimitConfig]) -> RateLimitConfig:
    """`build()` with the cyclic collector paused, its result frozen out of the collector's
    reach (as rls.process.gc_tuning does at start-up). A 10,000-domain build allocates hundreds of
    thousands of objects: left to the collector, they trigger full collections that hold the
    GIL for 100+ ms each, and the event loop's decisions wait behind them. Building leaves no
    cyclic garbage (rls.config.model.limits_of), so freezing keeps nothing dead alive; the
    collection first is short, the heap being frozen but for what changed since the last."""
    gc.collect()
    enabled = gc.isenabled()
    switch = sys.getswitchinterval()
    gc.disable()
    sys.setswitchinterval(BUILD_SWITCH_INTERVAL)
    try:
        config = build()
        gc.freeze()
        return config
    finally:
        sys.setswitchinterval(switch)
        if enabled:
            gc.enable()


def _iso(when: float | None) -> str | None:
    if when is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


async def start_source(
    settings: Settings, holder: ConfigHolder, registry: CollectorRegistry,
    stop: asyncio.Event | None = None,
) -> XdsConfigSource:
    """Open the stream. FORCE_START_WITHOUT_INITIAL_CONFIG: return at once with an empty
    config in force (no domain: every call OK, as the reference); otherwise return only once
    the first set is accepted (the reference opens no listener before) or `stop` is set — a
    SIGTERM while the controller has not pushed yet (the caller sees `first` unset)."""
    source = XdsConfigSource(settings, holder, registry)
    source.start()
    if settings.force_start_without_initial_config:
        if holder.config is None:
            holder.config = RateLimitConfig()
        log.info("xDS: serving before the first config (force start): every call OK until then")
    else:
        log.info("xDS: waiting for the first config from %s before serving",
                 settings.xds_server_url)
        await _first_or_stop(source.first, stop)
    return source


async def _first_or_stop(first: asyncio.Event, stop: asyncio.Event | None) -> None:
    """Wait for `first`, or for `stop` when given, whichever comes first."""
    waits = {asyncio.ensure_future(first.wait())}
    if stop is not None:
        waits.add(asyncio.ensure_future(stop.wait()))
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
