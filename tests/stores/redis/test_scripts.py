"""The Redis path's scripts: one small script per request shape, loaded on demand.

Pins what rls/stores/redis/scripts.py promises: a plain fixed-window request runs the lean script,
a request mixing algorithms is still one EVALSHA deciding all checks atomically, NOSCRIPT
(SCRIPT FLUSH, a restarted Redis) is recovered on the direct, batched and usage paths, and the
log algorithms stay exact (against the memory backend) with long logs and weighted hits,
including logs written in the earlier member format.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections.abc import Iterator

import pytest
from conftest import RedisServer

from rls.config.model import Limit, Unit
from rls.core.algorithms.base import GRACE_MS
from rls.core.model import CHARGE_ALWAYS, NEGATIVE, SHADOW, Check
from rls.stores.memory import MemoryBackend
from rls.stores.redis import RedisBackend
from rls.stores.redis.scripts import decide_script, lean_script

pytestmark = pytest.mark.redis


@pytest.fixture
async def backend(server: RedisServer):
    server.client().flushall()
    server.client().script_flush()
    b = RedisBackend(server.url, timeout_ms=5000, connect_timeout_ms=5000)
    yield b
    await b.close()


def sha(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def evalsha_calls(server: RedisServer) -> int:
    return server.client().info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)


def limit(algorithm: str, rpu: int, unit: Unit = Unit.MINUTE, **kw: object) -> Limit:
    return Limit(rpu, unit, algorithm=algorithm, **kw)  # type: ignore[arg-type]


def test_each_script_holds_only_the_algorithms_it_needs():
    fixed = decide_script(["fixed_window"])
    assert "log_algo" not in fixed and "bk_store" not in fixed and "ALGOS[1]" in fixed
    both = decide_script(["sliding_log", "concurrency"])
    assert both.count("local function log_algo") == 1 and "ALGOS[3]" in both
    assert "ALGOS[7]" in both and "fw_store" not in both
    assert "ALGOS" not in lean_script()
    assert fixed.startswith("local SHADOW, QUOTA, CHARGE_ALWAYS, NEGATIVE = 1, 2, 4, 8")
    assert "'TIME'" not in lean_script()  # no clock read: the keys carry their windows


async def test_plain_fixed_window_request_runs_the_lean_script(backend, server):
    lim = limit("fixed_window", 2)
    checks = [Check(0, lim, "fw:a", 1), Check(1, lim, "fw:b", 1)]
    verdict = await backend.decide(checks)
    assert verdict.admitted and [o.remaining for o in verdict.outcomes] == [1, 1]
    client = server.client()
    assert client.script_exists(sha(lean_script())) == [True]
    assert client.script_exists(sha(decide_script())) == [False]


@pytest.mark.parametrize("shape", ["lean", "mixed"])
async def test_plain_window_counts_in_its_own_key_expiring_with_the_window(backend, server, shape):
    """The layout rls/stores/windows.py promises, whichever script writes it: an integer in
    `<key>@<window index>`, expiring at the window's end (+ GRACE_MS); the next window starts
    a new key at zero."""
    lim = limit("fixed_window", 5)
    window = lim.window_ms
    now = (int(time.time() * 1000) // window) * window + 1_000  # 1 s into the current window
    extra = [Check(1, limit("token_bucket", 5), "tb:x", 1)] if shape == "mixed" else []
    for _ in range(3):
        await backend.decide([Check(0, lim, "fw:a", 2), *extra], now)
    client = server.client()
    key = f"fw:a@{now // window}"
    assert client.get(key) == b"4"  # the third request was over (4 + 2 > 5): not charged
    assert window - 5_000 < client.pttl(key) <= window - 1_000 + GRACE_MS
    later = await backend.decide([Check(0, lim, "fw:a", 2), *extra], now + window)
    assert later.admitted and later.outcomes[0].used == 0
    assert client.get(f"fw:a@{now // window + 1}") == b"2" and client.get(key) == b"4"


async def test_mixed_algorithms_are_one_evalsha_and_atomic(backend, server):
    fw, tb, log = limit("fixed_window", 5), limit("token_bucket", 5), limit("sliding_log", 2)
    now = int(time.time() * 1000)

    def request(prefix: str = "m") -> list[Check]:
        return [
            Check(0, fw, f"{prefix}:fw", 1),
            Check(1, tb, f"{prefix}:tb", 1),
            Check(2, log, f"{prefix}:log", 1),
        ]

    await backend.decide(request("warm"), now)  # the first use loads this mix's script
    before = evalsha_calls(server)
    for _ in range(2):
        assert (await backend.decide(request(), now)).admitted
    third = await backend.decide(request(), now)
    assert evalsha_calls(server) - before == 3  # one round trip per request, whatever the mix
    assert not third.admitted
    assert [o.ok for o in third.outcomes] == [True, True, False]
    assert not any(o.charged for o in third.outcomes)  # the log was full: nothing is charged
    peek = await backend.peek(request(), now)
    assert [o.used for o in peek.outcomes] == [2, 2, 2]
    assert server.client().script_exists(
        sha(decide_script(["fixed_window", "token_bucket", "sliding_log"]))
    ) == [True]


async def test_lean_and_general_scripts_share_a_fixed_window_counter(backend):
    fw, tb = limit("fixed_window", 3), limit("token_bucket", 10)
    now = int(time.time() * 1000)
    await backend.decide([Check(0, fw, "s:fw", 1)], now)  # lean script
    mixed = await backend.decide([Check(0, fw, "s:fw", 1), Check(1, tb, "s:tb", 1)], now)
    assert mixed.outcomes[0].used == 1 and mixed.outcomes[0].remaining == 1
    lean = await backend.decide([Check(0, fw, "s:fw", 1)], now)
    assert lean.outcomes[0].used == 2 and lean.outcomes[0].remaining == 0
    assert not (await backend.decide([Check(0, fw, "s:fw", 1)], now)).admitted


async def test_lean_script_keeps_flags_semantics(backend):
    fw = limit("fixed_window", 1)
    now = int(time.time() * 1000)
    shadow = Check(0, fw, "f:shadow", 5, SHADOW)
    always = Check(1, fw, "f:always", 1, CHARGE_ALWAYS)
    enforce = Check(2, fw, "f:enforce", 2)  # over its limit of 1: the request is rejected
    verdict = await backend.decide([shadow, always, enforce], now)
    assert not verdict.admitted
    assert [o.charged for o in verdict.outcomes] == [False, True, False]
    release = await backend.decide([Check(0, fw, "f:always", 1, NEGATIVE)], now)
    assert release.admitted and release.outcomes[0].remaining == 1
    zero = await backend.decide([Check(0, fw, "f:zero", 0)], now)
    assert zero.admitted and zero.outcomes[0].remaining == 1 and zero.outcomes[0].ok


@pytest.mark.parametrize("path", ["direct", "batched", "with usage"])
async def test_noscript_after_script_flush_recovers(backend, server, path):
    fw, log = limit("fixed_window", 100), limit("sliding_log", 100)
    shapes = [
        [Check(0, fw, "n:fw", 1)],
        [Check(0, fw, "n:fw2", 1), Check(1, log, "n:log", 1)],
        [Check(0, log, "n:log2", 1)],
    ]

    async def decide(checks: list[Check]) -> bool:
        if path == "with usage":
            verdict = await backend.decide(checks, None, [("c", "n:usage", "")], 60_000)
        else:
            verdict = await backend.decide(checks)
        return verdict.admitted

    for checks in shapes:
        assert await decide(checks)
    server.client().script_flush()
    if path == "batched":  # concurrent calls share pipelines; every one hits NOSCRIPT
        results = await asyncio.gather(*(decide(shapes[i % 3]) for i in range(30)))
        rounds = 1 + 10
    else:
        results = [await decide(checks) for checks in shapes]
        rounds = 2
    assert all(results)
    peek = await backend.peek(shapes[1])
    assert [o.used for o in peek.outcomes] == [rounds, rounds]
    if path == "with usage":
        assert int(server.client().get("n:usage")) == 6  # usage counted once per call


def _long_log_requests(seed: int, n: int) -> Iterator[tuple[int, int, bool]]:
    rng = random.Random(seed)
    offset = 0
    for _ in range(n):
        offset += rng.choice((0, 0, 1, 3, 20, 90))
        yield offset, rng.choice((1, 1, 1, 2, 3, 7)), rng.random() < 0.05


@pytest.mark.parametrize("algorithm", ["sliding_log", "concurrency"])
async def test_long_log_is_exact_against_the_memory_backend(backend, server, algorithm):
    """3,000 decisions on a 1,000-hit-per-10-s log with weighted hits and releases: every
    outcome (ok, charged, remaining, reset, used) matches the memory backend, and a decision
    reads a bounded number of log entries whatever the log's length."""
    lim = limit(algorithm, 1000, Unit.SECOND, unit_multiplier=10)
    memory = MemoryBackend()
    base = int(time.time() * 1000)  # injected time runs ahead of real time: TTLs stay valid
    client = server.client()
    client.config_resetstat()
    n = 0
    for offset, hits, negative in _long_log_requests(7, 3000):
        check = Check(0, lim, f"long:{algorithm}", hits, NEGATIVE if negative else 0)
        expected = memory.decide_now([check], base + offset)
        got = await backend.decide([check], base + offset)
        assert got == expected, (n, offset, hits, negative)
        n += 1
    assert client.zcard(f"long:{algorithm}") > 300  # the log did grow long
    stats = client.info("commandstats")
    zrange_per_decision = stats["cmdstat_zrange"]["calls"] / n
    assert zrange_per_decision < 4, zrange_per_decision  # no scan: ends, and a short search


async def test_log_in_the_earlier_member_format_is_rewritten(backend, server):
    lim = limit("sliding_log", 10)
    client = server.client()
    now = int(time.time() * 1000)
    client.zadd("old:log", {"1:2": now - 3000, "2:1": now - 2000, "10:3": now - 1000})
    client.pexpire("old:log", 50_000)
    verdict = await backend.decide([Check(0, lim, "old:log", 1)], now)
    assert verdict.admitted and verdict.outcomes[0].used == 6
    assert verdict.outcomes[0].reset_ms == 60_000 - 3000
    members = [m.decode() for m in client.zrange("old:log", 0, -1)]
    assert members == [f"{c:016d}:{h}" for c, h in ((2, 2), (3, 1), (6, 3), (7, 1))]
    assert client.pttl("old:log") > 60_000  # the new entry's expiry: a window and more


async def test_log_rewritten_by_a_peek_keeps_an_expiry_covering_later_charges(backend, server):
    lim = limit("sliding_log", 10)
    client = server.client()
    now = int(time.time() * 1000)
    client.zadd("old:peek", {"1:1": now - 1000})
    client.pexpire("old:peek", 60_000 - 1000 + 1000)  # the earlier rule: newest + window + 1 s
    assert (await backend.peek([Check(0, lim, "old:peek", 1)], now)).outcomes[0].used == 1
    # A charge later in the same aligned window sets no expiry of its own: the rewrite must
    # already have set one that covers an entry logged up to the end of that window.
    window_end = (now // 60_000 + 1) * 60_000
    assert client.pttl("old:peek") >= window_end + 60_000 - now
    await backend.decide([Check(0, lim, "old:peek", 1)], now + 10)
    assert client.pttl("old:peek") >= window_end + 60_000 - now - 1000


async def test_load_scripts_loads_the_lean_and_the_named_algorithms_scripts(backend, server):
    await backend.load_scripts(["sliding_log", "gcra"])
    loaded = server.client().script_exists(
        sha(lean_script()), sha(decide_script(["sliding_log"])), sha(decide_script(["gcra"])),
        sha(decide_script(["token_bucket"])),
    )
    assert loaded == [True, True, True, False]


@pytest.mark.parametrize("algorithm", ["sliding_log", "concurrency"])
async def test_log_key_outlives_its_newest_entry_across_windows(backend, server, algorithm):
    """On Redis's own clock (no injected time), for 2.5 s of 1-second windows: after every
    charge the key expires no sooner than its newest entry + window + GRACE_MS, though PEXPIRE
    is only sent when an entry lands in a new aligned window."""
    lim = limit(algorithm, 1_000_000, Unit.SECOND)
    client = server.client()
    key = f"exp:{algorithm}"
    client.config_resetstat()
    started = time.monotonic()
    decisions = 0
    while time.monotonic() - started < 2.5:
        assert (await backend.decide([Check(0, lim, key, 1)])).admitted
        decisions += 1
        ((_, newest),) = client.zrange(key, -1, -1, withscores=True)
        assert client.pexpiretime(key) >= newest + 1000 + 1000
    pexpires = client.info("commandstats")["cmdstat_pexpire"]["calls"]
    assert 2 <= pexpires <= 4 < decisions  # once per aligned second, not once per charge
