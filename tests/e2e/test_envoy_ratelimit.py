"""A real Envoy 1.40 running envoy/gateway.yaml in front of `rls serve` and a recording backend.

Limits are per hour: fixed windows are epoch-aligned, so the `same_hour_window` fixture
(conftest.py) makes sure a test does not straddle an hour boundary.
"""

from __future__ import annotations

import time

import pytest

from .harness import HOUR, Gateway, Response

pytestmark = pytest.mark.envoy

PER_PATH = 3  # ("user", id), ("path", :path)
ITEMS = 10  # ("api", "items"), ("user", id)
PER_ADDRESS = 10000  # ("remote_address", ip)
TRANSLATE_BYTES = 1000  # ("api", "translate"), ("user", id), weighted by body bytes

DESCRIPTORS = f"""\
domain: gateway
descriptors:
  - key: user
    descriptors:
      - key: path
        rate_limit: {{unit: hour, requests_per_unit: {PER_PATH}}}
  - key: api
    value: items
    descriptors:
      - key: user
        rate_limit: {{name: items_per_user, unit: hour, requests_per_unit: {ITEMS}}}
  - key: remote_address
    rate_limit: {{unit: hour, requests_per_unit: {PER_ADDRESS}}}
  - key: api
    value: translate
    descriptors:
      - key: user
        rate_limit:
          name: translate_bytes_per_user
          unit: hour
          requests_per_unit: {TRANSLATE_BYTES}
          charge: on_allow  # a request-time cost: one that does not fit charges nothing
"""



@pytest.fixture
def gw(gateway_factory, same_hour_window) -> Gateway:
    return gateway_factory(DESCRIPTORS)


def assert_allowed(resp: Response, remaining: int, limit: int, gw: Gateway) -> int:
    """A 200 carrying rls's verdict; returns x-ratelimit-reset."""
    assert resp.status == 200, f"{resp}\n{gw.logs()}"
    assert resp.int_header("x-ratelimit-remaining") == remaining, resp.headers
    assert resp.headers["x-ratelimit-limit"].split(",")[0] == str(limit), resp.headers
    reset = resp.int_header("x-ratelimit-reset")
    assert 0 < reset <= HOUR
    assert "retry-after" not in resp.headers
    return reset


def assert_limited(resp: Response, gw: Gateway) -> int:
    """A 429 from the ratelimit filter; returns retry-after."""
    assert resp.status == 429, f"{resp}\n{gw.logs()}"
    assert resp.headers.get("x-envoy-ratelimited") == "true", resp.headers
    assert resp.int_header("x-ratelimit-remaining") == 0
    retry_after = resp.int_header("retry-after")
    assert retry_after in range(1, HOUR + 1)
    return retry_after


def seconds_to_window_end() -> float:
    return HOUR - time.time() % HOUR


def test_allowed_then_limited_with_ratelimit_headers(gw: Gateway) -> None:
    path = "/items?page=1"
    resets = []
    for remaining in range(PER_PATH - 1, -1, -1):
        resp = gw.call(path, "alice")
        resets.append(assert_allowed(resp, remaining, PER_PATH, gw))
        # All three descriptors came back with a limit: one entry per status, hour windows.
        policies = resp.headers["x-ratelimit-limit"]
        assert f"{PER_PATH};w={HOUR}" in policies
        assert f'{ITEMS};w={HOUR};name="items_per_user"' in policies
        assert f"{PER_ADDRESS};w={HOUR}" in policies
    # Epoch-aligned fixed window: the reset is the time to the end of the current UTC hour.
    assert abs(resets[-1] - seconds_to_window_end()) <= 2, resets
    assert resets == sorted(resets, reverse=True)

    limited = gw.call(path, "alice")
    retry_after = assert_limited(limited, gw)
    assert limited.headers["x-ratelimit-limit"].split(",")[0] == str(PER_PATH)
    assert abs(retry_after - seconds_to_window_end()) <= 2
    assert retry_after == limited.int_header("x-ratelimit-reset")

    # Exactly the allowed requests reached the backend, as alice, with the API key stripped.
    seen = [r for r in gw.backend.seen() if r.path == path]
    assert len(seen) == PER_PATH
    assert all(r.headers.get("x-client-id") == "alice" for r in seen)
    assert all("x-api-key" not in r.headers for r in seen)
    stats = gw.envoy.counters("cluster.backend.ratelimit.")
    assert stats.get("cluster.backend.ratelimit.over_limit") == 1, stats
    assert stats.get("cluster.backend.ratelimit.error", 0) == 0, stats


def test_items_api_limit_is_shared_across_paths(gw: Gateway) -> None:
    # Each page has its own ("user","path") counter (3/h); ("api","items") spans them (10/h).
    for n in range(1, ITEMS + 1):
        resp = gw.call(f"/items?page={n}", "alice")
        left = ITEMS - n
        if left < PER_PATH - 1:  # the items limit is now the tighter one
            assert_allowed(resp, left, ITEMS, gw)
        else:
            assert_allowed(resp, PER_PATH - 1, PER_PATH, gw)
    limited = gw.call(f"/items?page={ITEMS + 1}", "alice")
    assert_limited(limited, gw)
    assert limited.headers["x-ratelimit-limit"].split(",")[0] == str(ITEMS)
    # Paths outside /items are not under the items limit.
    assert_allowed(gw.call("/other", "alice"), PER_PATH - 1, PER_PATH, gw)


def test_weighted_hits_by_request_body_size(gw: Gateway) -> None:
    body = b"x" * 400
    for remaining in (TRANSLATE_BYTES - 400, TRANSLATE_BYTES - 800):
        resp = gw.call("/translate", "alice", method="POST", body=body)
        assert_allowed(resp, remaining, TRANSLATE_BYTES, gw)
        policies = resp.headers["x-ratelimit-limit"]
        assert f'{TRANSLATE_BYTES};w={HOUR};name="translate_bytes_per_user"' in policies
    # 400 bytes do not fit in the 200 left: rejected, and (`charge: on_allow`) not charged.
    assert_limited(gw.call("/translate", "alice", method="POST", body=body), gw)
    assert_allowed(gw.call("/translate", "alice", method="POST", body=b"y" * 150), 50,
                   TRANSLATE_BYTES, gw)
    # No body: Envoy sends hits_addend 0, which checks without charging.
    assert_allowed(gw.call("/translate", "alice", method="POST", body=b""), 50,
                   TRANSLATE_BYTES, gw)
    # The byte budget is per user.
    assert_allowed(gw.call("/translate", "bob", method="POST", body=body),
                   TRANSLATE_BYTES - 400, TRANSLATE_BYTES, gw)

    sizes = [len(r.body) for r in gw.backend.seen() if r.path == "/translate"]
    assert sizes == [400, 400, 150, 0, 400]
    # rls counted the weighted hits: 400 + 400 + 150 + 0 + 400 charged, plus the rejected 400.
    assert gw.rls_metric("rls_limit_total_hits_total",
                         key="gateway.api_translate.user") == 1750


def test_users_have_independent_counters(gw: Gateway) -> None:
    path = "/items?page=1"
    for remaining in range(PER_PATH - 1, -1, -1):
        assert_allowed(gw.call(path, "alice"), remaining, PER_PATH, gw)
    assert_limited(gw.call(path, "alice"), gw)

    # bob, same path, same client address: his own counters.
    assert_allowed(gw.call(path, "bob"), PER_PATH - 1, PER_PATH, gw)
    # A client-supplied x-client-id is overwritten by the API key's client: still alice.
    assert_limited(gw.call(path, "alice", headers={"x-client-id": "bob"}), gw)
    for remaining in range(PER_PATH - 2, -1, -1):
        assert_allowed(gw.call(path, "bob"), remaining, PER_PATH, gw)
    assert_limited(gw.call(path, "bob"), gw)
    assert_limited(gw.call(path, "alice"), gw)

    clients = [r.headers.get("x-client-id") for r in gw.backend.seen() if r.path == path]
    assert clients == ["alice"] * PER_PATH + ["bob"] * PER_PATH


def test_rejected_before_rls_never_reaches_it(gw: Gateway) -> None:
    calls_before = gw.rls_metric("rls_requests_total", domain="gateway")
    assert calls_before >= 1  # the warm-up went through rls: the metric is live
    ratelimit_stats = gw.envoy.counters("cluster.backend.ratelimit.")
    seen_before = len(gw.backend.seen())

    no_key = gw.call("/items?page=1")
    wrong_key = gw.call("/items?page=1", headers={"x-api-key": "not-a-key"})
    spoofed = gw.call("/items?page=1", headers={"x-client-id": "alice"})
    for resp in (no_key, wrong_key, spoofed):
        assert resp.status == 401, f"{resp}\n{gw.logs()}"
        assert "x-ratelimit-limit" not in resp.headers
    # Authenticated but over the 64 KiB body limit: 413 from the buffer filter, before rls.
    too_big = gw.call("/translate", "alice", method="POST", body=b"z" * 70000)
    assert too_big.status == 413, f"{too_big}\n{gw.logs()}"

    # rls answered every call it got before Envoy replied, so a call would already show.
    assert gw.rls_metric("rls_requests_total", domain="gateway") == calls_before
    assert gw.envoy.counters("cluster.backend.ratelimit.") == ratelimit_stats
    assert len(gw.backend.seen()) == seen_before
    # And the counters are untouched: alice's first real request sees a full quota.
    assert_allowed(gw.call("/items?page=1", "alice"), PER_PATH - 1, PER_PATH, gw)
    assert_allowed(gw.call("/translate", "alice", method="POST", body=b"x" * 100),
                   TRANSLATE_BYTES - 100, TRANSLATE_BYTES, gw)
    assert gw.rls_metric("rls_requests_total", domain="gateway") == calls_before + 2


def test_rls_down_fails_open(gw: Gateway) -> None:
    # gateway.yaml has failure_mode_deny: false: without rls, requests are proxied unlimited.
    # rls drains on SIGTERM and exits 0: a clean stop, not a crash Envoy happens to survive.
    assert gw.rls.stop() == 0, gw.rls.log()
    for _ in range(PER_PATH + 1):
        resp = gw.call("/items?page=1", "alice")
        assert resp.status == 200, f"{resp}\n{gw.logs()}"
        assert "x-ratelimit-limit" not in resp.headers
    stats = gw.envoy.counters("cluster.backend.ratelimit.")
    assert stats.get("cluster.backend.ratelimit.failure_mode_allowed") == PER_PATH + 1, stats
