"""A private redis-server per module (these tests flush scripts, pause the server and read its
command statistics), and a started RedisBackend on it, flushed per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from conftest import RedisServer, start_redis

from rls.stores.redis import RedisBackend


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    redis = start_redis()
    yield redis
    redis.stop()


@pytest.fixture
async def started(server: RedisServer) -> AsyncIterator[RedisBackend]:
    """A RedisBackend started on `server` (wire open, scripts loaded), its data flushed."""
    server.client().flushall()
    b = RedisBackend(server.url, timeout_ms=5000, connect_timeout_ms=5000)
    await b.start()
    yield b
    await b.close()
