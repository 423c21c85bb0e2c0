"""`rls serve --redis-leases on` against a real Redis: hot counters are decided from leases (the
lease metrics move, Redis sees a refill per many decisions), every decision is exact, and on
SIGTERM the tokens leased ahead go back, so the counter holds exactly the hits admitted."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import RedisServer
from support.calls import Grpc, descriptor, scrape, value

pytestmark = [pytest.mark.process, pytest.mark.redis]

DAY = 86_400
CONFIG = """
domain: leased
descriptors:
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 1000}
"""


@pytest.fixture
def same_day_window() -> Iterator[None]:
    """The limit is an epoch-aligned day: do not straddle its end."""
    left = DAY - time.time() % DAY
    if left < 60:
        time.sleep(left + 0.5)  # a known wait for a clock boundary, not for readiness
    start = int(time.time() // DAY)
    yield
    assert int(time.time() // DAY) == start, "test straddled a day window boundary"


def window_counters(server: RedisServer) -> dict[str, int]:
    client = server.client()
    return {
        key.decode(): int(client.get(key) or 0)
        for key in client.scan_iter(match="*tenant|acme*")
        if not key.endswith(b"!lease")
    }


def test_a_leasing_rls_decides_exactly_and_gives_its_leases_back_at_sigterm(
    tmp_path: Path, rls_factory: Callable[..., Any], redis_server: RedisServer, redis_url: str,
    same_day_window: None,
) -> None:
    config = tmp_path / "leased.yaml"
    config.write_text(CONFIG)
    rls = rls_factory(config, args=("--redis-url", redis_url, "--redis-leases", "on",
                                    "--backend-timeout-ms", "2000"))
    with Grpc(f"127.0.0.1:{rls.grpc_port}") as client:
        codes = [client.call("leased", descriptor(("tenant", "acme")), hits=3).overall_code
                 for _ in range(400)]
    ok = codes.count(1)
    assert ok == 333, f"1000 // 3 requests of 3 fit in 1000, not {ok}:\n{rls.log()}"
    samples = scrape(rls.http_url)
    decisions = value(samples, "rls_lease_decisions_total")
    refills = value(samples, "rls_lease_refills_total")
    assert decisions > 300, samples
    assert 0 < refills < decisions / 5
    assert rls.stop() == 0
    counters = window_counters(redis_server)
    assert list(counters.values()) == [999], counters
