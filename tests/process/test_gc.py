"""The garbage collector stays off the request path.

- Our decision path (match, decide, build the response) creates no cyclic garbage: whatever a
  burst of decisions allocates is freed by reference counting, so the collector has nothing to
  find and no reason to walk the heap.
- A started rls has frozen its start-up objects out of the collector's walk and exports every
  collection's pause (`rls_gc_pause_seconds`), so a pause that slips through is visible.
"""

from __future__ import annotations

import gc

import pytest
from conftest import http_get

from rls.config.loader import load_files
from rls.engine.limiter import DescriptorIn, RateLimiter
from rls.observability.metrics import Metrics
from rls.services.convert import to_response
from rls.settings import Settings
from rls.stores.memory import MemoryBackend

pytestmark = pytest.mark.slow

CONFIG = """
domain: g
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: api
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: sliding_window}
"""


async def test_decisions_leave_no_cyclic_garbage() -> None:
    config = load_files([("g.yaml", CONFIG)])
    limiter = RateLimiter(lambda: config, MemoryBackend(sweep_interval=0), Settings(), Metrics())

    async def burst(n: int) -> None:
        for i in range(n):
            decision = await limiter.should_rate_limit(
                "g",
                [DescriptorIn((("user", f"u{i % 97}"),)),
                 DescriptorIn((("api", "translate"), ("user", f"u{i}")))],
            )
            to_response(decision).SerializeToString()

    await burst(200)  # first-time structures (memos, metric children) are not garbage
    gc.collect()
    gc.disable()
    try:
        await burst(3000)  # within and over the limits
        found = gc.collect()
    finally:
        gc.enable()
    assert found == 0, f"{found} objects of cyclic garbage after 3000 decisions"


def test_a_started_rls_froze_its_objects_and_exports_gc_pauses(rls_factory, tmp_path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(CONFIG)
    rls = rls_factory(path)
    status, body = http_get(rls.http_url + "/metrics")
    assert status == 200
    text = body.decode()
    frozen = [line for line in text.splitlines() if line.startswith("rls_gc_frozen_objects ")]
    assert frozen and float(frozen[0].split()[1]) > 10_000, frozen
    # The freeze itself ran one full collection: generation 2 was observed.
    assert 'rls_gc_pause_seconds_count{generation="2"}' in text
    assert "rls_event_loop_lag_seconds_bucket" in text

