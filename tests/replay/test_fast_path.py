"""The replay fast path for plain fixed windows decides exactly as the service's engine does,
decision by decision: nested descriptors, `replaces`, two descriptors on one counter, weighted
and 0-hit checks, releases (ignored), unlimited and unmatched descriptors, window ends, lines
slightly out of order."""

from __future__ import annotations

import random

import pytest

from rls.config.loader import load_files
from rls.engine.decision import DescriptorIn
from rls.replay.engines import FastEngine, GeneralEngine, fast_domain
from rls.replay.reader import Shape
from rls.settings import Settings

from .logs import T0

CONFIG = """\
domain: fast
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 4}
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 9}
  - key: api
    rate_limits:
      - {unit: second, requests_per_unit: 6}
      - {unit: minute, requests_per_unit: 30, unit_multiplier: 2}
  - key: tier
    value: base
    rate_limit: {name: base, unit: second, requests_per_unit: 2}
  - key: tier
    value: gold
    rate_limit: {unit: second, requests_per_unit: 5, replaces: [{name: base}]}
  - key: free
    rate_limit: {unlimited: true}
"""


def descriptor(rng: random.Random) -> DescriptorIn:
    kind = rng.choice(["user", "path", "api", "base", "gold", "free", "none"])
    hits = rng.choice([None, None, None, 0, 2, 5])
    negative = rng.random() < 0.03
    entries = {
        "user": (("user", rng.choice("ab")),),
        "path": (("user", rng.choice("ab")), ("path", rng.choice("xy"))),
        "api": (("api", rng.choice("pq")),),
        "base": (("tier", "base"),),
        "gold": (("tier", "gold"),),
        "free": (("free", "1"),),
        "none": (("nothing", "1"),),
    }[kind]
    return DescriptorIn(entries, hits, negative)


@pytest.mark.parametrize("seed", range(4))
async def test_fast_path_equals_the_general_engine_decision_by_decision(seed: int) -> None:
    config = load_files([("c.yaml", CONFIG)], False)
    assert fast_domain(config.domains["fast"], Settings())
    fast = FastEngine(config, 0)
    general = GeneralEngine(config, Settings(local_cache=False))
    rng = random.Random(seed)
    ts = T0 - 3000
    over = 0
    for _ in range(3000):
        ts += rng.choice((0, 0, 3, 40, 250))
        at = ts - rng.choice((0, 0, 0, 0, 700))  # now and then a line logged late
        shape = Shape("fast", tuple(descriptor(rng) for _ in range(rng.randint(1, 3))),
                      rng.choice((0, 0, 1, 3)))
        expected = await general.decide(at, shape)
        assert fast.decide(at, shape) == expected, (at, shape.texts, shape.hits)
        over += expected[0]
    assert 300 < over < 2700  # both answers happen plenty


async def test_a_sweep_keeps_the_fast_path_exact_and_its_memory_to_live_counters() -> None:
    config = load_files([("c.yaml", CONFIG)], False)
    fast = FastEngine(config, 0)
    general = GeneralEngine(config, Settings(local_cache=False))
    shapes = [Shape("fast", (DescriptorIn((("user", f"u{i}"),)),), 0) for i in range(300)]
    ts = T0
    for n in range(6000):
        ts += 7
        if n == 3000:  # 10 s without traffic: every window so far has passed
            ts += 10_000
            fast.sweep(ts)
            assert len(fast.cells) == 0
        shape = shapes[n % 300 if n < 3000 else n % 7]  # 300 callers, then only 7
        assert fast.decide(ts, shape) == await general.decide(ts, shape)
    assert len(fast.cells) == 7
