"""Quota mode end to end: real Envoy 1.40 (envoy/gateway-rlqs.yaml) enforcing rls's YAML limits.

Windows are a few seconds (unit_multiplier) so a test spans two or three of them. Admitted
counts are asserted per window against bounds derived from how quota mode works, not timing:
every token Envoy holds was charged to the counter first, so a window admits at most the limit
plus what Envoy admits before rls has answered at all (one request per new bucket per Envoy,
`no_assignment_behavior: ALLOW_ALL`) and in the milliseconds between a report and its answer.
"""

from __future__ import annotations

import time
from collections import Counter

from e2e.harness import Envoy, http_get_text

from .conftest import QuotaRig


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
    print('PER', per, windows)
    assert windows, per
    # Every window: at most the limit plus the one request admitted before rls's first answer.
    assert all(count <= 6 + 1 for count in per.values()), per
    # Full windows with demand 40 for a limit of 6: the limit is dealt, nothing lost.
    for w in windows:
        assert per[w] >= 6 - 1, (w, per)
    # The limit is per client: another client still gets its own quota.
    bob = [envoy.request("GET", "/api", headers={"x-client-id": "bob"}).status for _ in range(3)]
    assert bob.count(200) >= 1, bob
    assert rls_metric(rls.http_url, "rls_quota_streams") == 1
    assert rls_metric(rls.http_url, "rls_quota_assignments_total", action="token_bucket") >= 1
