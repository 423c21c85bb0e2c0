"""Quota mode end to end: real Envoy 1.40 (envoy/gateway-rlqs.yaml) enforcing rls's YAML limits.

Windows are a few seconds (unit_multiplier) so a test spans two or three of them. Admitted
counts are asserted per window against bounds derived from how quota mode works, not timing:
every token Envoy holds was charged to the counter first, so a window admits at most the limit
plus what Envoy admits before rls has answered at all (one request per new bucket per Envoy,
`no_assignment_behavior: ALLOW_ALL`) and in the milliseconds between a report and its answer.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from conftest import start_redis
from e2e.harness import Envoy, http_get_text, wait_for

from .conftest import DOMAIN, QuotaRig

pytestmark = [pytest.mark.slow, pytest.mark.envoy]

WINDOW_S = 5


def drive(
    envoy: Envoy, seconds: float, rate: float, headers: dict[str, str] | None = None
) -> list[tuple[float, int]]:
    """Requests at a steady pace for `seconds`: (wall time, status) for each."""
    out: list[tuple[float, int]] = []
    start = time.monotonic()
    n = 0
    while True:
        due = start + n / rate
        now = time.monotonic()
        if due - start >= seconds:
            return out
        if due > now:
            time.sleep(due - now)  # pacing the offered load, not waiting for a condition
        resp = envoy.request("GET", "/api", headers=headers or {})
        out.append((time.time(), resp.status))
        n += 1
        assert resp.status in (200, 429), resp


def admitted_per_window(results: list[tuple[float, int]], window_s: int) -> dict[int, int]:
    per: Counter[int] = Counter()
    for t, status in results:
        per[int(t // window_s)] += 0
        if status == 200:
            per[int(t // window_s)] += 1
    return dict(per)


def full_windows(results: list[tuple[float, int]], window_s: int) -> list[int]:
    """Windows the traffic covered from start to end (not the partial first and last)."""
    first = int(results[0][0] // window_s)
    last = int(results[-1][0] // window_s)
    return list(range(first + 1, last))


def rls_metric(http_url: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    status, text = http_get_text(http_url + "/metrics")
    assert status == 200, text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


PER_CLIENT = """
domain: gateway-rlqs
descriptors:
  - key: x-client-id
    rate_limit: {unit: second, unit_multiplier: 4, requests_per_unit: 6}
"""


def test_one_envoy_enforces_the_yaml_limit_per_client_header(rig: QuotaRig) -> None:
    rls = rig.rls(rig.descriptors(PER_CLIENT))
    envoy = rig.envoy(rls.grpc_port)
    results = drive(envoy, seconds=10, rate=10, headers={"x-client-id": "alice"})
    per = admitted_per_window(results, 4)
    windows = full_windows(results, 4)
    assert windows, per
    # Every window: at most the limit plus the one request admitted before rls's first answer.
    assert all(count <= 6 + 1 for count in per.values()), per
    # Full windows with demand 40 for a limit of 6: every window admits some, and the limit
    # is dealt in full when rls's push at the window reset reaches Envoy in time. (Windows of
    # 4 s are shorter than Envoy's 5 s report cadence: a push delayed on a loaded machine can
    # leave part of one window unused; accuracy over long windows is measured by
    # benchmarks/quota_mode.py --part accuracy: 1.000x the limit.)
    assert all(per[w] >= 1 for w in windows), per
    assert max(per[w] for w in windows) >= 6 - 1, per
    # The limit is per client: another client still gets its own quota.
    bob = [envoy.request("GET", "/api", headers={"x-client-id": "bob"}).status for _ in range(3)]
    assert bob.count(200) >= 1, bob
    assert rls_metric(rls.http_url, "rls_quota_streams") == 1
    assert rls_metric(rls.http_url, "rls_quota_assignments_total", action="token_bucket") >= 1


CANDIDATE = """
domain: gateway-rlqs
descriptors:
  - key: x-client-id
    rate_limit: {unit: hour, requests_per_unit: 1000}
    candidates: [{name: halve, requests_per_unit: 5}]
"""


def test_a_candidate_counts_what_envoy_reports_and_never_limits(rig: QuotaRig) -> None:
    """12 requests under a live limit of 1000/hour with a candidate of 5: all 12 pass, and once
    Envoy reported them (every 5 s) the candidate counted 12, 7 of them over and 1 near (the
    5th, past 80 % of 5), and /top names the client."""
    import json

    rls = rig.rls(rig.descriptors(CANDIDATE))
    envoy = rig.envoy(rls.grpc_port)
    statuses = [envoy.request("GET", "/api", headers={"x-client-id": "carol"}).status
                for _ in range(12)]
    assert statuses == [200] * 12
    labels = {"domain": DOMAIN, "limit": f"{DOMAIN}.x-client-id", "candidate": "halve"}
    wait_for(lambda: rls_metric(rls.http_url, "rls_candidate_checks_total", **labels) >= 12,
             timeout=20, what="Envoy's report of the 12 requests")
    assert rls_metric(rls.http_url, "rls_candidate_checks_total", **labels) == 12
    assert rls_metric(rls.http_url, "rls_candidate_over_limit_total", **labels) == 7
    assert rls_metric(rls.http_url, "rls_candidate_near_limit_total", **labels) == 1
    status, text = http_get_text(rls.http_url + "/top")
    assert status == 200, text
    rows = json.loads(text)["candidates"][DOMAIN]
    assert [(r["descriptor"], r["over"]) for r in rows] == [("x-client-id=carol", 7)]


SHARED = """
domain: gateway-rlqs
descriptors:
  - key: name
    value: anonymous
    rate_limit: {unit: second, unit_multiplier: 5, requests_per_unit: 20}
"""


def drive_together(envoys_rates: list[tuple[Envoy, float]], seconds: float) -> list:
    """Drive several Envoys at once (one thread each); all results merged."""
    results: list[list[tuple[float, int]]] = [[] for _ in envoys_rates]

    def one(i: int, envoy: Envoy, rate: float) -> None:
        results[i] = drive(envoy, seconds, rate)

    threads = [
        threading.Thread(target=one, args=(i, envoy, rate))
        for i, (envoy, rate) in enumerate(envoys_rates)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 30)
    merged = sorted(r for rs in results for r in rs)
    assert all(results), "a driver thread produced nothing"
    return merged


def assert_shared_limit(results: list[tuple[float, int]], envoys: int) -> dict[int, int]:
    """At most the limit plus, per Envoy, one request before any assignment and one admitted
    between a report and its answer.

    Lower bound: with a window as short as the 5 s report cadence, tokens a stream holds but
    does not use are given back only at its next report, which may come after the window
    ended: up to the slower Envoy's demand over one cadence (3/s * 5 s = 15) can go unused.
    Long windows (benchmarks/quota_mode.py) are dealt to within a few percent.
    """
    per = admitted_per_window(results, WINDOW_S)
    assert all(count <= 20 + 2 * envoys for count in per.values()), per
    windows = full_windows(results, WINDOW_S)
    assert windows, per
    for w in windows:
        assert per[w] >= 20 - 15, (w, per)
    return per


def test_two_envoys_share_one_limit_through_one_rls(rig: QuotaRig) -> None:
    rls = rig.rls(rig.descriptors(SHARED))
    a, b = rig.envoy(rls.grpc_port), rig.envoy(rls.grpc_port)
    results = drive_together([(a, 12), (b, 3)], seconds=12)
    assert_shared_limit(results, envoys=2)
    assert rls_metric(rls.http_url, "rls_quota_streams") == 2


def test_two_envoys_share_one_limit_through_two_rls_on_one_redis(
    rig: QuotaRig, redis_url: str
) -> None:
    config = rig.descriptors(SHARED)
    first, second = rig.rls(config, redis_url=redis_url), rig.rls(config, redis_url=redis_url)
    a, b = rig.envoy(first.grpc_port), rig.envoy(second.grpc_port)
    results = drive_together([(a, 12), (b, 3)], seconds=12)
    assert_shared_limit(results, envoys=2)
    for rls in (first, second):
        assert rls_metric(rls.http_url, "rls_quota_streams") == 1


ALICE_ONLY = """
domain: gateway-rlqs
descriptors:
  - key: x-client-id
    value: alice
    rate_limit: {unit: minute, requests_per_unit: 3}
"""


def test_unmatched_bucket_is_allowed_and_a_bucket_dropped_by_reload_is_abandoned(
    rig: QuotaRig,
) -> None:
    config = rig.descriptors(ALICE_ONLY)
    rls = rig.rls(config)
    envoy = rig.envoy(rls.grpc_port)
    bob = [envoy.request("GET", "/api", headers={"x-client-id": "bob"}).status
           for _ in range(10)]
    assert bob == [200] * 10
    # Alice's first request creates her bucket; Envoy reports it at once and rls answers with
    # an assignment. Wait for that answer (a loaded machine may take a while), then go on.
    sent = rls_metric(rls.http_url, "rls_quota_assignments_total")
    alice = [envoy.request("GET", "/api", headers={"x-client-id": "alice"}).status]
    wait_for(lambda: rls_metric(rls.http_url, "rls_quota_assignments_total") > sent,
             timeout=10, what="an assignment for alice's new bucket")
    alice += [envoy.request("GET", "/api", headers={"x-client-id": "alice"}).status
              for _ in range(9)]
    assert alice.count(200) <= 3 + 1 and 429 in alice, alice
    config.write_text(SHARED)  # alice's descriptor is gone
    wait_for(
        lambda: rls_metric(rls.http_url, "rls_quota_assignments_total", action="abandon") >= 1,
        timeout=15, what="abandon_action for alice's bucket",
    )
    wait_for(
        lambda: envoy.request("GET", "/api", headers={"x-client-id": "alice"}).status == 200,
        timeout=5, what="alice allowed once her bucket is unmatched",
    )
    assert rls_metric(rls.http_url, "rls_quota_usage_total", limit="_unmatched",
                      result="allowed") >= 10


RESTART = """
domain: gateway-rlqs
descriptors:
  - key: x-client-id
    rate_limit: {unit: second, unit_multiplier: 6, requests_per_unit: 8}
"""


def test_rls_restart_mid_traffic_neither_double_counts_nor_loses_the_limit(
    rig: QuotaRig, redis_url: str
) -> None:
    config = rig.descriptors(RESTART)
    rls = rig.rls(config, redis_url=redis_url)
    envoy = rig.envoy(rls.grpc_port)
    restarted: list[float] = []

    def restart() -> None:
        time.sleep(4)  # mid-traffic, by design of the scenario
        rls.stop()
        rig.rls(config, grpc_port=rls.grpc_port, redis_url=redis_url)
        restarted.append(time.time())

    thread = threading.Thread(target=restart)
    thread.start()
    results = drive(envoy, seconds=24, rate=6, headers={"x-client-id": "alice"})
    thread.join(30)
    assert restarted, "rls was not restarted"
    per = admitted_per_window(results, 6)
    assert all(count <= 8 + 2 for count in per.values()), per
    # Windows that start once Envoy is back on the new rls (it reconnects at its next 5 s
    # tick) get the whole limit: usage the old rls charged is not charged again.
    after = [w for w in full_windows(results, 6) if w * 6 >= restarted[0] + 5]
    assert after, (per, restarted, results[0][0])
    for w in after:
        assert per[w] >= 8 - 1, (w, per)


def test_dead_redis_follows_the_failure_mode(rig: QuotaRig) -> None:
    redis = start_redis()
    try:
        rls = rig.rls(rig.descriptors(PER_CLIENT), redis_url=redis.url,
                      args=("--failure-mode", "deny"))
        envoy = rig.envoy(rls.grpc_port)
        assert envoy.request("GET", "/api", headers={"x-client-id": "carol"}).status == 200
        redis.stop()
        # A new bucket: its first request passes before any answer (no_assignment_behavior),
        # then rls answers the failure mode, DENY_ALL, for a few seconds.
        wait_for(
            lambda: envoy.request("GET", "/api", headers={"x-client-id": "dave"}).status == 429,
            timeout=5, what="failure-mode deny for a bucket dealt while Redis is down",
        )
        assert rls_metric(rls.http_url, "rls_quota_errors_total", reason="backend") >= 1
        assert rls_metric(rls.http_url, "rls_quota_assignments_total", action="deny_all") >= 1
    finally:
        redis.stop()


PER_10S = """
domain: gateway-rlqs
descriptors:
  - key: x-client-id
    rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 60}
"""


def sleep_until(wall: float) -> None:
    time.sleep(max(0.0, wall - time.time()))  # scheduling the scenario, not awaiting a state


@pytest.mark.parametrize(("rate", "restart_at"), [(18.0, 6), (7.2, 8)], ids=["3x", "1.2x"])
def test_restart_in_mid_window_keeps_the_limit_over_three_windows(
    rig: QuotaRig, redis_url: str, rate: float, restart_at: int
) -> None:
    """SIGTERM renews what Envoy holds, ends the streams and gives their reservations back;
    Envoy keeps enforcing what it holds and reports its use to the new rls, which charges it.
    Before, the draining rls pushed (and charged) the next window and the new one answered
    DENY_ALL (61 / 60 / 36 at 3x; 17 / 29 / 34 at 1.2x, restarted 8 s into the window)."""
    config = rig.descriptors(PER_10S)
    drain = ("--shutdown-delay-ms", "1000", "--drain-seconds", "5")  # the defaults
    rls = rig.rls(config, redis_url=redis_url, args=drain)
    envoy = rig.envoy(rls.grpc_port)
    first = (int(time.time() // 10) + 1) * 10  # the first full window
    windows = [first // 10 + i for i in range(3)]
    restarted: list[float] = []

    def restart() -> None:
        # Mid-window, so that a drain as long as the defaults allow spans the window's end.
        sleep_until(first + restart_at)
        rls.stop()
        rig.rls(config, grpc_port=rls.grpc_port, redis_url=redis_url, args=drain)
        restarted.append(time.time())

    thread = threading.Thread(target=restart)
    thread.start()
    results = drive(envoy, seconds=first + 30 - time.time() + 0.5, rate=rate,
                    headers={"x-client-id": "alice"})
    thread.join(30)
    assert restarted, "rls was not restarted"
    per = admitted_per_window(results, 10)
    counts = [per.get(w, 0) for w in windows]
    # each window at most the limit plus what Envoy admits before an answer (one new bucket's
    # first request, requests between a report and its answer)
    assert all(c <= 60 + 3 for c in counts), counts
    assert 0.9 * 180 <= sum(counts) <= 1.1 * 180, counts


def test_two_envoys_with_equal_demand_get_equal_shares(rig: QuotaRig) -> None:
    """One rls, one counter, two streams asking alike: each gets half of every window (±10 %)
    whichever reports first after the reset. Before: 46 / 14 of 60 in every window."""
    rls = rig.rls(rig.descriptors(PER_10S.replace("x-client-id", "name")
                                  .replace("    rate_limit", "    value: anonymous\n"
                                           "    rate_limit")))
    a, b = rig.envoy(rls.grpc_port), rig.envoy(rls.grpc_port)
    first = (int(time.time() // 10) + 1) * 10
    results: list[list[tuple[float, int]]] = [[], []]

    def one(i: int, envoy: Envoy) -> None:
        results[i] = drive(envoy, seconds=first + 30 - time.time() + 0.5, rate=12)

    threads = [threading.Thread(target=one, args=(i, e)) for i, e in enumerate((a, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    windows = [first // 10 + 1, first // 10 + 2]  # after the first window's new buckets
    got = [sum(admitted_per_window(r, 10).get(w, 0) for w in windows) for r in results]
    total = sum(got)
    assert total >= 0.9 * 120, got
    assert all(abs(g - total / 2) <= 0.1 * total / 2 for g in got), got


PER_HOUR = """
domain: gateway-rlqs
descriptors:
  - key: x-client-id
    rate_limit: {unit: hour, requests_per_unit: 50}
"""


def test_a_stream_that_ends_right_after_its_grant_costs_the_next_stream_nothing(
    rig: QuotaRig,
) -> None:
    """A stream granted the whole limit ends having admitted nothing; the Envoy that reports
    the bucket next gets the grant back instead of DENY_ALL for the rest of the hour."""
    import grpc
    from envoy.service.rate_limit_quota.v3 import rlqs_pb2

    rls = rig.rls(rig.descriptors(PER_HOUR))
    message = rlqs_pb2.RateLimitQuotaUsageReports(domain=DOMAIN)
    usage = message.bucket_quota_usages.add()
    usage.bucket_id.bucket.update({"name": "per-client", "x-client-id": "alice"})
    channel = grpc.insecure_channel(f"127.0.0.1:{rls.grpc_port}")
    answers = channel.stream_stream(
        "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas")(iter([message.SerializeToString()]))
    granted = [
        action.quota_assignment_action.rate_limit_strategy.token_bucket.max_tokens
        for data in answers  # the client half-closed: the stream ends after this answer
        for action in rlqs_pb2.RateLimitQuotaResponse.FromString(data).bucket_action
    ]
    channel.close()
    assert max(granted) == 50, granted
    wait_for(lambda: rls_metric(rls.http_url, "rls_quota_streams") == 0, timeout=10,
             what="the first stream ended")
    envoy = rig.envoy(rls.grpc_port)
    first = envoy.request("GET", "/api", headers={"x-client-id": "alice"}).status
    wait_for(lambda: rls_metric(rls.http_url, "rls_quota_assignments_total",
                                action="token_bucket") >= 2,
             timeout=10, what="a grant for Envoy's bucket")
    statuses = [first] + [envoy.request("GET", "/api", headers={"x-client-id": "alice"}).status
                          for _ in range(59)]
    assert 45 <= statuses.count(200) <= 50 + 1, statuses.count(200)
