"""Top talkers: the heavy-hitters sketch behind admin /top and `rls top`."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from rls.config.loader import load_files
from rls.engine.limiter import DescriptorIn, RateLimiter
from rls.engine.top import CAPACITY, MAX_TEXT, NEAR, OVER, SpaceSaving, TopTalkers, merge_top
from rls.observability.metrics import Metrics
from rls.settings import Settings
from rls.stores.memory import MemoryBackend


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=3000))
def test_space_saving_overestimates_within_its_error_and_keeps_heavy_hitters(stream) -> None:
    sketch = SpaceSaving(capacity=16)
    true: dict[str, int] = {}
    for item in stream:
        text = f"user={item}"
        sketch.add(text, OVER, 1)
        true[text] = true.get(text, 0) + 1
    assert len(sketch.counts) <= 16
    for text, (over, _near, error) in sketch.counts.items():
        assert true[text] <= over <= true[text] + error
    # Every item above total/capacity is listed.
    for text, count in true.items():
        if count > len(stream) / 16:
            assert text in sketch.counts


def test_windows_forget_old_slots_and_rank_by_kind() -> None:
    now = [1000.0]
    top = TopTalkers(clock=lambda: now[0])
    for _ in range(30):
        top.record("d", (("user", "old"),), OVER, 1)
    now[0] += 120  # two minutes later: out of the 1-minute view, still in the 5-minute view
    for _ in range(5):
        top.record("d", (("user", "new"),), OVER, 1)
    for _ in range(9):
        top.record("d", (("user", "close"),), NEAR, 1)
    one = merge_top([top.snapshot()], window="1m")["d"]
    assert [r["descriptor"] for r in one] == ["user=new"]
    five = merge_top([top.snapshot()], window="5m")["d"]
    assert [r["descriptor"] for r in five] == ["user=old", "user=new"]
    near = merge_top([top.snapshot()], window="1m", sort="near")["d"]
    assert near == [{"descriptor": "user=close", "over": 0, "near": 9, "error": 0}]
    now[0] += 600
    top.record("d", (("user", "x"),), OVER, 1)
    assert len(top._slots["d"]) == 1  # slots older than 5 minutes were dropped


def test_workers_snapshots_are_summed() -> None:
    a, b = TopTalkers(clock=lambda: 50.0), TopTalkers(clock=lambda: 50.0)
    a.record("d", (("ip", "1"),), OVER, 3)
    b.record("d", (("ip", "1"),), OVER, 4)
    b.record("e", (("ip", "2"),), OVER, 1)
    merged = merge_top([a.snapshot(), b.snapshot()])
    assert merged["d"][0]["over"] == 7 and merged["e"][0]["descriptor"] == "ip=2"
    assert list(merge_top([a.snapshot(), b.snapshot()], domain="e")) == ["e"]


def test_memory_is_bounded_whatever_the_traffic() -> None:
    top = TopTalkers(clock=lambda: 0.0)
    rng = random.Random(7)
    for i in range(20_000):
        top.record("d", (("user", f"{rng.random()}" * 40),), OVER, 1)
        if i % 1000 == 0:
            top.record("d", (("user", "hot"),), OVER, 1000)
    counts = top._slots["d"][0].counts
    assert len(counts) <= CAPACITY
    assert all(len(t.encode()) <= MAX_TEXT for t in counts)
    assert merge_top([top.snapshot()])["d"][0]["descriptor"] == "user=hot"


async def test_the_limiter_records_over_and_near_limit_descriptors() -> None:
    config = load_files([("t.yaml", "domain: t\ndescriptors:\n  - key: user\n"
                          "    rate_limit: {unit: hour, requests_per_unit: 10}\n")])
    limiter = RateLimiter(lambda: config, MemoryBackend(sweep_interval=0),
                          Settings(), Metrics())
    for _ in range(13):
        await limiter.should_rate_limit("t", [DescriptorIn((("user", "greedy"),))])
    await limiter.should_rate_limit("t", [DescriptorIn((("user", "calm"),))])
    rows = merge_top([limiter.top.snapshot()])["t"]
    assert rows == [{"descriptor": "user=greedy", "over": 3, "near": 2, "error": 0}]
