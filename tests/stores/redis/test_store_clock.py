"""The store's clock read locally (rls/stores/redis/clock.py): plain fixed windows are picked by the
client, so every replica must read the window off Redis's clock, not its host's."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from conftest import RedisServer, start_redis

from rls.config.model import Limit, Unit
from rls.core.model import Check
from rls.stores.redis import RedisBackend
from rls.stores.redis.clock import StoreClock

pytestmark = pytest.mark.redis

HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    redis = start_redis()
    yield redis
    redis.stop()


def test_a_reading_sets_the_offset_from_the_store_time():
    clock = StoreClock()
    store_ms = int(time.time() * 1000) + HOUR_MS  # a store whose clock is an hour ahead
    clock.sync(lambda: divmod(store_ms * 1000, 1_000_000))  # TIME: (seconds, microseconds)
    assert clock.synced and clock.error_ms is not None and clock.error_ms < 50
    assert abs(clock.now_ms() - store_ms) < 1_000


def test_a_failed_reading_keeps_the_previous_offset():
    clock = StoreClock()
    before = clock.now_ms()

    def down() -> tuple[int, int]:
        raise ConnectionError("store down")

    with pytest.raises(ConnectionError):
        clock.sync(down)
    assert not clock.synced and abs(clock.now_ms() - before) < 1_000


async def test_start_reads_the_store_clock(server: RedisServer):
    backend = RedisBackend(server.url, timeout_ms=2000, connect_timeout_ms=2000)
    try:
        backend.clock._offset_ms += HOUR_MS  # this host's clock an hour off
        await backend.start()
        sec, usec = server.client().time()
        assert backend.clock.synced
        assert abs(backend.clock.now_ms() - (sec * 1000 + usec // 1000)) < 100
    finally:
        await backend.close()


async def test_a_skewed_host_counts_in_the_store_window(server: RedisServer):
    """Two replicas, one with its host clock an hour ahead: after start both charge the same
    window key, so the limit holds across them."""
    lim = Limit(3, Unit.HOUR)
    server.client().flushall()
    good, skewed = RedisBackend(server.url), RedisBackend(server.url)
    try:
        skewed.clock._offset_ms += HOUR_MS
        await good.start()
        await skewed.start()
        admitted = [
            (await b.decide([Check(0, lim, "skew:k", 1)])).admitted
            for b in (good, skewed, good, skewed)
        ]
        assert admitted == [True, True, True, False]
        assert len(server.client().keys("skew:k@*")) == 1
    finally:
        await good.close()
        await skewed.close()


async def test_a_store_clock_far_from_the_host_is_logged(server: RedisServer, caplog):
    backend = RedisBackend(server.url, timeout_ms=2000, connect_timeout_ms=2000)
    try:
        with caplog.at_level("WARNING", logger="rls.backend"):
            await backend.clock.sync_in(backend._probe_thread,
                                        lambda: divmod((int(time.time() * 1000) - HOUR_MS) * 1000,
                                                       1_000_000))
        assert "redis clock is" in caplog.text and "behind this host's" in caplog.text
    finally:
        await backend.close()
