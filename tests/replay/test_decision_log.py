"""`--decision-log`: a line per decision, sampled per caller, written off the request path;
replaying it reproduces the live decisions."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest

from rls.cli.main import parser
from rls.cli.replay import outcome
from rls.config.loader import load_files
from rls.engine.decision import DescriptorIn
from rls.engine.limiter import RateLimiter
from rls.observability.metrics import Metrics
from rls.settings import SettingError, Settings
from rls.stores.memory import MemoryBackend

from .logs import T0

CONFIG = """\
domain: app
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 3}
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 20}
"""


def limiter(tmp_path: Path, sample: float = 1.0) -> RateLimiter:
    config = load_files([("c.yaml", CONFIG)], False)
    settings = Settings(decision_log=str(tmp_path / "decisions.jsonl"), decision_log_sample=sample)
    return RateLimiter(lambda: config, MemoryBackend(sweep_interval=0), settings, Metrics())


async def test_replaying_the_decision_log_reproduces_the_live_decisions(tmp_path: Path) -> None:
    engine = limiter(tmp_path)
    rng = random.Random(5)
    over = 0
    for i in range(800):
        who = rng.choice(["alice", "bob", "carol"])
        descs = [DescriptorIn((("user", who),))]
        if rng.random() < 0.5:
            descs.append(DescriptorIn((("user", who), ("path", rng.choice("xy"))), hits=2))
        decision = await engine.should_rate_limit("app", descs, rng.choice((0, 1)),
                                                  now_ms=T0 + i * 40)
        over += decision.overall == 2
    assert engine.decisions is not None
    engine.decisions.close()
    log = tmp_path / "decisions.jsonl"
    first = json.loads(log.read_text().splitlines()[0])
    assert list(first)[:3] == ["ts", "code", "domain"] and first["ts"] == T0
    (tmp_path / "conf.yaml").write_text(CONFIG)
    args = parser().parse_args(
        ["replay", "--config", str(tmp_path / "conf.yaml"), "--log", str(log)]
    )
    _, report, _ = await asyncio.to_thread(outcome, args)  # its own event loop
    assert report is not None
    assert report["requests"] == 800 and report["over_limit"] == over > 50
    assert report["logged_answers"] == {"lines": 800, "same": 800, "different": 0,
                                        "first_different": []}


async def test_sampling_keeps_or_drops_a_caller_whole(tmp_path: Path) -> None:
    engine = limiter(tmp_path, sample=0.5)
    users = [f"user{i}" for i in range(40)]
    for i in range(400):
        await engine.should_rate_limit("app", [DescriptorIn((("user", users[i % 40]),))],
                                       now_ms=T0 + i)
    assert engine.decisions is not None
    engine.decisions.close()
    lines = [json.loads(x) for x in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    counts: dict[str, int] = {}
    for line in lines:
        who = line["descriptors"][0]["entries"][0][1]
        counts[who] = counts.get(who, 0) + 1
    assert set(counts.values()) == {10}  # every call of a sampled caller
    assert 8 < len(counts) < 32  # about half of the callers


async def test_a_call_to_an_unknown_domain_is_a_line_too(tmp_path: Path) -> None:
    """docs/changing-limits.md: one line per decision, a domain no file defines included (its
    traffic is what a config adding the domain must be replayed against)."""
    engine = limiter(tmp_path)
    calls = [("app", "alice"), ("nowhere", "bob"), ("app", "carol")]
    for i, (domain, who) in enumerate(calls):
        await engine.should_rate_limit(domain, [DescriptorIn((("user", who),))], now_ms=T0 + i)
    assert engine.decisions is not None
    engine.decisions.close()
    lines = [json.loads(line) for line in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    assert [(line["domain"], line["code"]) for line in lines] == [
        ("app", "OK"), ("nowhere", "OK"), ("app", "OK")
    ]


def test_a_sample_outside_0_to_1_is_refused() -> None:
    with pytest.raises(SettingError, match="between 0 and 1"):
        Settings(decision_log_sample=1.5).validate()
