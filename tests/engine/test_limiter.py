"""RateLimiter.should_rate_limit in process (MemoryBackend, injected clock).

Expectations come from DESIGN §6 and reference/ratelimit-compat.md §2 (statuses, replaces,
shadow and quota modes, hits_addend rules §2.3, stats split §2.4).
"""

from __future__ import annotations

import pytest

from rls.config.loader import load_files
from rls.config.model import Limit, Unit
from rls.engine.limiter import (
    OK,
    OVER_LIMIT,
    DescriptorIn,
    InvalidRequest,
    RateLimiter,
)
from rls.observability.metrics import Metrics
from rls.settings import Settings
from rls.stores.memory import MemoryBackend

UNLIMITED = 4294967295
T0 = 1_699_999_200_000  # aligned to the hour (so also to the minute and the second)
assert T0 % 3_600_000 == 0
NOW = T0 + 34_500  # 34.5 s into the minute

CONFIG = """
domain: lim
descriptors:
  - key: named
    rate_limit: {name: named_limit, unit: minute, requests_per_unit: 2}
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: hour
    rate_limit: {unit: hour, requests_per_unit: 5, accept_releases: true}
  - key: free
    rate_limit: {unlimited: true}
  - key: whitelist
  - key: base
    rate_limit: {name: base, unit: minute, requests_per_unit: 1}
  - key: special
    rate_limit:
      name: special
      unit: minute
      requests_per_unit: 10
      replaces: [{name: base}]
  - key: vip
    rate_limit:
      unlimited: true
      replaces: [{name: base}]
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: q1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: q2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: weighted
    rate_limit: {unit: minute, requests_per_unit: 10, accept_releases: true}
  - key: w20
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: w8
    rate_limit: {unit: minute, requests_per_unit: 8}
  - key: app
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 3}
"""


def make(settings: Settings | None = None) -> RateLimiter:
    config = load_files([("lim.yaml", CONFIG)])
    return RateLimiter(
        lambda: config, MemoryBackend(sweep_interval=0), settings or Settings(), Metrics()
    )


def d(key: str, value: str = "x", hits: int | None = None, negative: bool = False,
      override: tuple[int, int, int] | None = None) -> DescriptorIn:
    return DescriptorIn(((key, value),), hits, negative, override)


async def decide(limiter: RateLimiter, *descs: DescriptorIn, hits: int = 0, now: int = NOW,
                 domain: str = "lim"):
    return await limiter.should_rate_limit(domain, list(descs), hits, now)


async def remaining(limiter: RateLimiter, key: str, now: int = NOW) -> tuple[int, int]:
    """(code, remaining) of a 0-hit check, which charges nothing."""
    decision = await decide(limiter, d(key, hits=0), now=now)
    return decision.statuses[0].code, decision.statuses[0].remaining


def metric(limiter: RateLimiter, name: str, key: str) -> float:
    value = limiter.metrics.registry.get_sample_value(f"rls_limit_{name}_total", {"key": key})
    return value or 0.0


# -- statuses -------------------------------------------------------------------------------


async def test_statuses_in_request_order():
    lim = make()
    descs = [d("plain"), d("nosuchkey"), d("named"), d("free"), d("whitelist"), d("hour")]
    dec = await decide(lim, *descs)
    assert dec.overall == OK
    assert len(dec.statuses) == len(descs)
    plain, unknown, named, free, white, hour = dec.statuses

    assert plain.code == OK and plain.remaining == 0
    assert plain.limit.requests_per_unit == 1 and plain.limit.unit == Unit.SECOND
    assert plain.limit.name == ""
    assert plain.reset_seconds == 1

    assert unknown.code == OK and unknown.limit is None and unknown.remaining == 0
    assert unknown.reset_seconds is None

    assert named.code == OK and named.remaining == 1
    assert named.limit.requests_per_unit == 2 and named.limit.unit == Unit.MINUTE
    assert named.limit.name == "named_limit"
    assert named.reset_seconds == 26  # 60 - (34.5 s into the minute, whole seconds)

    assert free.code == OK and free.limit is None and free.remaining == UNLIMITED
    assert white.code == OK and white.limit is None and white.remaining == 0
    assert hour.code == OK and hour.remaining == 4 and hour.reset_seconds == 3600 - 34

    # Same request again in the same second: `plain` is over; the request is rejected, so the
    # passing `named` is not charged and reports its uncharged remaining.
    dec = await decide(lim, *descs)
    assert dec.overall == OVER_LIMIT
    codes = [s.code for s in dec.statuses]
    assert codes == [OVER_LIMIT, OK, OK, OK, OK, OK]
    assert dec.statuses[0].remaining == 0 and dec.statuses[0].limit is not None
    assert dec.statuses[2].remaining == 1
    assert dec.statuses[5].remaining == 4
    assert await remaining(lim, "named") == (OK, 1)


async def test_nested_descriptor_matches_on_depth():
    lim = make()
    dec = await decide(lim, DescriptorIn((("app", "a"), ("user", "u"))), DescriptorIn(
        (("app", "a"),)))
    assert dec.statuses[0].limit is not None and dec.statuses[0].remaining == 2
    assert dec.statuses[1].limit is None  # the container node has no limit


@pytest.mark.parametrize(
    ("offset_ms", "unit_key", "expected"),
    [
        (0, "named", 60),  # exactly at the boundary: a whole minute
        (59_999, "named", 1),
        (1, "named", 60),
        (30_000, "hour", 3570),
        (500, "plain", 1),
    ],
)
async def test_duration_until_reset(offset_ms, unit_key, expected):
    lim = make()
    dec = await decide(lim, d(unit_key), now=T0 + offset_ms)
    assert dec.statuses[0].reset_seconds == expected


async def test_unknown_domain_is_ok_for_every_descriptor():
    lim = make()
    descs = [d("named"), d("plain"), d("x", override=(1, int(Unit.MINUTE), 1))]
    for _ in range(3):
        dec = await decide(lim, *descs, domain="no-such-domain")
        assert dec.overall == OK
        assert len(dec.statuses) == 3
        for st in dec.statuses:
            assert st.code == OK and st.limit is None and st.remaining == 0
    assert lim.metrics.registry.get_sample_value(
        "rls_domain_not_found_total", {"domain": "no-such-domain"}
    ) == 9


async def test_unlimited_is_always_ok():
    lim = make()
    for _ in range(50):
        dec = await decide(lim, d("free"), hits=1000)
        assert dec.overall == OK
        st = dec.statuses[0]
        assert st.code == OK and st.remaining == UNLIMITED and st.limit is None


# -- replaces -------------------------------------------------------------------------------


async def test_replaced_limit_is_not_charged():
    lim = make()
    for _ in range(3):  # base allows 1/minute; replaced, it neither blocks nor counts
        dec = await decide(lim, d("base"), d("special"))
        assert dec.overall == OK
        assert dec.statuses[0].code == OK and dec.statuses[0].limit is None
        assert dec.statuses[1].limit.name == "special"
    assert (await decide(lim, d("special", hits=0))).statuses[0].remaining == 7
    # base's own counter is untouched: its single hit is still available.
    dec = await decide(lim, d("base"))
    assert dec.overall == OK and dec.statuses[0].remaining == 0
    assert (await decide(lim, d("base"))).overall == OVER_LIMIT


async def test_unlimited_limit_can_replace():
    lim = make()
    for _ in range(3):
        dec = await decide(lim, d("base"), d("vip"))
        assert dec.overall == OK
        assert dec.statuses[0].limit is None
        assert dec.statuses[1].remaining == UNLIMITED
    assert await remaining(lim, "base") == (OK, 1)


# -- shadow and quota -----------------------------------------------------------------------


async def test_per_rule_shadow_reports_ok():
    lim = make()
    assert (await decide(lim, d("shadowed"))).overall == OK
    dec = await decide(lim, d("shadowed"))
    assert dec.overall == OK
    st = dec.statuses[0]
    assert st.code == OK and st.remaining == 0 and st.limit is not None
    assert metric(lim, "shadow_mode", "lim.shadowed") == 1
    assert metric(lim, "over_limit", "lim.shadowed") == 1


async def test_global_shadow_mode():
    lim = make(Settings(shadow_mode=True))
    assert (await decide(lim, d("plain"))).overall == OK
    dec = await decide(lim, d("plain"))
    assert dec.overall == OK
    assert dec.statuses[0].code == OVER_LIMIT  # per-descriptor status left as is
    assert lim.metrics.registry.get_sample_value("rls_global_shadow_mode_total") == 1


async def test_quota_mode_rule():
    lim = make()
    dec = await decide(lim, d("q1"), d("q2"))
    assert dec.overall == OK
    assert [s.remaining for s in dec.statuses] == [0, 2]
    # q1 is exhausted, q2 has room: the request passes; only q2 is charged.
    dec = await decide(lim, d("q1"), d("q2"))
    assert dec.overall == OK
    assert dec.statuses[0].code == OVER_LIMIT
    assert dec.statuses[1].code == OK and dec.statuses[1].remaining == 1
    dec = await decide(lim, d("q1"), d("q2"))
    assert dec.overall == OK and dec.statuses[1].remaining == 0
    # All quota descriptors over: OVER_LIMIT.
    dec = await decide(lim, d("q1"), d("q2"))
    assert dec.overall == OVER_LIMIT
    assert [s.code for s in dec.statuses] == [OVER_LIMIT, OVER_LIMIT]


async def test_quota_does_not_save_an_over_non_quota_descriptor():
    lim = make()
    await decide(lim, d("plain"))
    dec = await decide(lim, d("q2"), d("plain"))
    assert dec.overall == OVER_LIMIT
    assert [s.code for s in dec.statuses] == [OK, OVER_LIMIT]
    assert await remaining(lim, "q2") == (OK, 3)


async def test_global_quota_mode():
    lim = make(Settings(quota_mode=True))
    await decide(lim, d("plain"))
    dec = await decide(lim, d("plain"), d("named"))
    assert dec.overall == OK  # any quota with room lets the request through
    assert [s.code for s in dec.statuses] == [OVER_LIMIT, OK]
    assert dec.statuses[1].remaining == 1


# -- hits -----------------------------------------------------------------------------------


async def test_hits_addend_rules():
    lim = make()
    # The descriptor's own hits_addend wins, 0 included (check without charging).
    dec = await decide(lim, d("weighted", hits=0), hits=5)
    assert dec.overall == OK and dec.statuses[0].remaining == 10
    dec = await decide(lim, d("weighted", hits=2), hits=5)
    assert dec.statuses[0].remaining == 8
    # Else the request's hits_addend when > 0.
    dec = await decide(lim, d("weighted"), hits=5)
    assert dec.statuses[0].remaining == 3
    # Else 1.
    dec = await decide(lim, d("weighted"), hits=0)
    assert dec.statuses[0].remaining == 2
    assert await remaining(lim, "weighted") == (OK, 2)
    # A cost larger than what remains is rejected and charges nothing.
    dec = await decide(lim, d("weighted"), hits=3)
    assert dec.overall == OVER_LIMIT and dec.statuses[0].remaining == 0
    assert await remaining(lim, "weighted") == (OK, 2)
    dec = await decide(lim, d("weighted", hits=2))
    assert dec.overall == OK and dec.statuses[0].remaining == 0
    # 0 hits at exactly full: no room for one more.
    dec = await decide(lim, d("weighted", hits=0))
    assert dec.overall == OVER_LIMIT and dec.statuses[0].code == OVER_LIMIT


async def test_negative_hits_give_hits_back():
    lim = make()
    await decide(lim, d("weighted", hits=7))
    dec = await decide(lim, d("weighted", hits=5, negative=True))
    assert dec.overall == OK
    assert await remaining(lim, "weighted") == (OK, 8)
    # Releases apply even in a rejected request.
    await decide(lim, d("plain"))
    dec = await decide(lim, d("weighted", hits=2, negative=True), d("plain"))
    assert dec.overall == OVER_LIMIT
    assert await remaining(lim, "weighted") == (OK, 10)
    # Never below zero.
    await decide(lim, d("weighted", hits=50, negative=True))
    assert await remaining(lim, "weighted") == (OK, 10)


async def test_identical_descriptors_are_each_charged():
    """Two identical descriptors in one request: each costs its hits (the reference INCRBYs
    the counter once per descriptor; DESIGN §6 charges every matched limit)."""
    lim = make()
    dec = await decide(lim, d("hour"), d("hour"))
    assert dec.overall == OK
    assert await remaining(lim, "hour") == (OK, 3)
    # named allows 2/minute: a request carrying it three times costs 3 and must be rejected.
    dec = await decide(lim, d("named"), d("named"), d("named"))
    assert dec.overall == OVER_LIMIT
    assert await remaining(lim, "named") == (OK, 2)


async def test_charge_and_release_of_one_counter_in_one_request():
    lim = make()
    await decide(lim, d("hour", hits=3))
    dec = await decide(lim, d("hour", hits=1), d("hour", hits=2, negative=True))
    assert dec.overall == OK
    assert await remaining(lim, "hour") == (OK, 5 - (3 + 1 - 2))


# -- limit override -------------------------------------------------------------------------


async def test_limit_override_from_request():
    lim = make()
    override = (2, int(Unit.HOUR), 1)
    desc = DescriptorIn((("anything", "v1"),), override=override)
    dec = await decide(lim, desc)
    st = dec.statuses[0]
    assert dec.overall == OK and st.code == OK
    assert st.limit.requests_per_unit == 2 and st.limit.unit == Unit.HOUR
    assert st.limit.name == ""
    assert st.remaining == 1 and st.reset_seconds == 3600 - 34
    assert (await decide(lim, desc)).statuses[0].remaining == 0
    dec = await decide(lim, desc)
    assert dec.overall == OVER_LIMIT and dec.statuses[0].code == OVER_LIMIT
    # The override replaces the configured limit of a known key too (config not consulted).
    dec = await decide(lim, DescriptorIn((("named", "x"),), override=(5, int(Unit.MINUTE), 1)))
    assert dec.statuses[0].limit.requests_per_unit == 5 and dec.statuses[0].remaining == 4


@pytest.mark.parametrize("unit", [0, 99])
async def test_limit_override_with_invalid_unit_is_rejected(unit):
    lim = make()
    with pytest.raises(InvalidRequest):
        await decide(lim, DescriptorIn((("k", "v"),), override=(5, unit, 1)), d("named"))
    assert await remaining(lim, "named") == (OK, 2)


# -- stats split (ratelimit-compat §2.4) ----------------------------------------------------


@pytest.mark.parametrize(
    ("cap", "addend", "after", "over", "near", "within"),
    [
        (20, 3, 5, 0, 0, 3),
        (8, 2, 7, 0, 1, 2),
        (20, 3, 19, 0, 3, 3),
        (20, 3, 22, 2, 1, 0),
        (20, 7, 22, 2, 4, 0),
        (10, 3, 30, 3, 0, 0),
    ],
)
def test_stats_split_worked_cases(cap, addend, after, over, near, within):
    metrics = Metrics()
    limit = Limit(requests_per_unit=cap, unit=Unit.MINUTE, full_key="d.k")
    metrics.record_limit(limit, None, addend, after - addend, after > cap, False)
    get = metrics.registry.get_sample_value
    assert get("rls_limit_total_hits_total", {"key": "d.k"}) == addend
    assert get("rls_limit_over_limit_total", {"key": "d.k"}) == over
    assert get("rls_limit_near_limit_total", {"key": "d.k"}) == near
    assert get("rls_limit_within_limit_total", {"key": "d.k"}) == within
    assert (get("rls_limit_shadow_mode_total", {"key": "d.k"}) or 0) == 0


def test_stats_split_shadow_and_series():
    metrics = Metrics()
    limit = Limit(requests_per_unit=20, unit=Unit.MINUTE, full_key="d.s", shadow_mode=True)
    metrics.record_limit(limit, None, 3, 19, True, True)
    get = metrics.registry.get_sample_value
    assert get("rls_limit_shadow_mode_total", {"key": "d.s"}) == 2
    assert get("rls_limit_over_limit_total", {"key": "d.s"}) == 2
    # 15/HOUR, addend 1, afters 11, 13, 16: cumulative near 0, 1, 1 and over 0, 0, 1.
    limit = Limit(requests_per_unit=15, unit=Unit.HOUR, full_key="d.h")
    seen = []
    for after in (11, 13, 16):
        metrics.record_limit(limit, None, 1, after - 1, after > 15, False)
        seen.append((get("rls_limit_near_limit_total", {"key": "d.h"}) or 0,
                     get("rls_limit_over_limit_total", {"key": "d.h"}) or 0))
    assert seen == [(0, 0), (1, 0), (1, 1)]


async def test_stats_through_the_limiter():
    lim = make()
    key = "lim.w20"
    await decide(lim, d("w20", hits=19))
    before = {n: metric(lim, n, key) for n in ("total_hits", "over_limit", "near_limit",
                                              "within_limit")}
    assert before == {"total_hits": 19, "over_limit": 0, "near_limit": 3, "within_limit": 19}
    dec = await decide(lim, d("w20", hits=3))
    assert dec.overall == OVER_LIMIT
    delta = {n: metric(lim, n, key) - v for n, v in before.items()}
    assert delta == {"total_hits": 3, "over_limit": 2, "near_limit": 1, "within_limit": 0}

    await decide(lim, d("w8", hits=5))
    base = {n: metric(lim, n, "lim.w8") for n in ("over_limit", "near_limit", "within_limit")}
    await decide(lim, d("w8", hits=2))
    delta = {n: metric(lim, n, "lim.w8") - v for n, v in base.items()}
    assert delta == {"over_limit": 0, "near_limit": 1, "within_limit": 2}

    # A 0-hit check that is over counts nothing (reference: total +0, over +0).
    await decide(lim, d("w8", hits=1))
    totals = metric(lim, "total_hits", "lim.w8"), metric(lim, "over_limit", "lim.w8")
    dec = await decide(lim, d("w8", hits=0))
    assert dec.overall == OVER_LIMIT
    assert (metric(lim, "total_hits", "lim.w8"), metric(lim, "over_limit", "lim.w8")) == totals


async def test_unlimited_and_replaced_emit_no_stats():
    lim = make()
    await decide(lim, d("free"), d("base"), d("special"))
    assert metric(lim, "total_hits", "lim.free") == 0
    assert metric(lim, "total_hits", "lim.base") == 0
    assert metric(lim, "total_hits", "lim.special") == 1


async def test_stats_key_label_is_escaped_like_the_reference_stat_name():
    """envoyproxy/ratelimit emits `<stats key>.total_hits` with `:` and `|` turned into `_`
    and the dots of IPv4 addresses too (its statsd names; its mapper then splits on dots into
    `key1`, `key2`). The `key` label carries that emitted form, so the documented recording
    rules give an IP-valued detailed metric one `key1`, not four."""
    config = load_files([("esc.yaml", """
domain: esc
descriptors:
  - key: ip
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    value: "/a:b|c"
    rate_limit: {unit: minute, requests_per_unit: 5}
""")])
    lim = RateLimiter(lambda: config, MemoryBackend(sweep_interval=0), Settings(), Metrics())
    await decide(lim, DescriptorIn((("ip", "10.0.0.1"),)), domain="esc")
    await decide(lim, DescriptorIn((("path", "/a:b|c"),)), domain="esc")
    lim.metrics.flush()
    assert metric(lim, "total_hits", "esc.ip_10_0_0_1") == 1
    assert metric(lim, "total_hits", "esc.path_/a_b_c") == 1
    assert metric(lim, "total_hits", "esc.ip_10.0.0.1") == 0
