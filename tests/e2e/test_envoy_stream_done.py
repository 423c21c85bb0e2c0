"""Descriptors sent after the stream completes (`apply_on_stream_done`), through a real Envoy 1.40.

envoy/gateway-stream-done.yaml (generated from gateway.yaml, routes in stream_done_routes.yaml):
- /slow: ("inflight", <client id>) acquired on the request call (rls `algorithm: concurrency`)
  and released by Envoy's fire-and-forget stream-done call with `is_negative_hits`;
- /download: ("api", "download"), ("user", <client id>) checked with hits_addend 0 on the
  request call and charged `%BYTES_SENT%` on stream done (rls `charge: always`).

The stream-done call races the test (Envoy sends it after the client already has its
response), so every assertion about it polls rls's counter query (`POST /counters`) or the
number of calls rls answered, never a sleep.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from .harness import HOUR, Gateway, Response, wait_for

pytestmark = pytest.mark.envoy

MAX_INFLIGHT = 2
DOWNLOAD_BYTES = 1000
RESPONSE_BYTES = 600

DESCRIPTORS = f"""\
domain: gateway
descriptors:
  - key: inflight
    rate_limit: {{unit: minute, requests_per_unit: {MAX_INFLIGHT}, algorithm: concurrency}}
  - key: api
    value: download
    descriptors:
      - key: user
        rate_limit:
          name: download_bytes_per_user
          unit: hour
          requests_per_unit: {DOWNLOAD_BYTES}
          charge: always
  - key: user            # the default route (gateway_factory's warm-up request)
    descriptors:
      - key: path
        rate_limit: {{unit: hour, requests_per_unit: 100}}
"""

CONFIG = "gateway-stream-done.yaml"



@pytest.fixture
def gw(gateway_factory: Callable[..., Gateway]) -> Gateway:
    return gateway_factory(DESCRIPTORS, CONFIG)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=8) as executor:
        yield executor


def rls_calls(gw: Gateway) -> float:
    """ShouldRateLimit calls rls has answered (request-time and stream-done alike)."""
    return gw.rls_metric("rls_requests_total", domain="gateway")


def wait_used(gw: Gateway, descriptor: tuple[tuple[str, str], ...], used: int) -> None:
    wait_for(
        lambda: gw.rls_used(*descriptor) == used, 5.0,
        f"rls counter {descriptor} used == {used} (now {gw.rls_used(*descriptor)})",
        alive=gw.envoy.alive, log=gw.logs,
    )


def assert_limited(resp: Response, limit: int, gw: Gateway) -> None:
    assert resp.status == 429, f"{resp}\n{gw.logs()}"
    assert resp.headers.get("x-envoy-ratelimited") == "true", resp.headers
    assert resp.int_header("x-ratelimit-remaining") == 0
    assert resp.headers["x-ratelimit-limit"].split(",")[0] == str(limit), resp.headers


def test_concurrency_lease_per_request_released_on_stream_done(
    gw: Gateway, pool: ThreadPoolExecutor
) -> None:
    gate = gw.backend.hold("/slow")
    alice = (("inflight", "alice"),)

    def in_flight(path: str, user: str) -> Future[Response]:
        """Send a request that passes rls and is then held by the backend."""
        future = pool.submit(gw.call, path, user)
        wait_for(
            lambda: any(s.path == path for s in gw.backend.seen()) or future.done(), 5.0,
            f"{path} to reach the backend", alive=gw.envoy.alive, log=gw.logs,
        )
        assert not future.done(), f"{path} was answered instead of held: {future.result()}"
        return future

    first = in_flight("/slow?n=1", "alice")
    second = in_flight("/slow?n=2", "alice")
    assert gw.rls_used(*alice) == MAX_INFLIGHT  # one lease per request on the request call

    # Third concurrent request: over the in-flight limit.
    calls = rls_calls(gw)
    assert_limited(gw.call("/slow?n=3", "alice"), MAX_INFLIGHT, gw)
    # Envoy still sends the stream-done release for the rejected request (request call +
    # stream-done call). The config's CEL hits_addend makes it give back 0, so the two live
    # leases survive: a plain `number: 1` release would drop one here and let n=4 through.
    wait_for(lambda: rls_calls(gw) == calls + 2, 5.0, "the rejected request's stream-done call",
             alive=gw.envoy.alive, log=gw.logs)
    assert gw.rls_used(*alice) == MAX_INFLIGHT
    assert_limited(gw.call("/slow?n=4", "alice"), MAX_INFLIGHT, gw)

    # Leases are per client: bob is not affected by alice's.
    bob = in_flight("/slow?user=bob", "bob")
    assert gw.rls_used(("inflight", "bob")) == 1

    # Finish one of alice's requests: once its fire-and-forget release lands, one slot is free.
    gate.release("/slow?n=1")
    done = first.result(timeout=5)
    assert done.status == 200, f"{done}\n{gw.logs()}"
    assert done.int_header("x-ratelimit-remaining") == MAX_INFLIGHT - 1  # verdict at its start
    wait_used(gw, alice, MAX_INFLIGHT - 1)
    fifth = in_flight("/slow?n=5", "alice")
    assert gw.rls_used(*alice) == MAX_INFLIGHT
    # Exactly one slot was freed.
    assert_limited(gw.call("/slow?n=6", "alice"), MAX_INFLIGHT, gw)

    gate.open()
    for future in (second, fifth, bob):
        resp = future.result(timeout=5)
        assert resp.status == 200, f"{resp}\n{gw.logs()}"
    wait_used(gw, alice, 0)
    wait_used(gw, (("inflight", "bob"),), 0)
    # Only the admitted requests reached the backend.
    slow = [(s.path, s.headers.get("x-client-id")) for s in gw.backend.seen()
            if s.path.startswith("/slow")]
    assert slow == [("/slow?n=1", "alice"), ("/slow?n=2", "alice"), ("/slow?user=bob", "bob"),
                    ("/slow?n=5", "alice")]


def test_response_bytes_charged_after_the_response(gw: Gateway, same_hour_window: None) -> None:
    budget = (("api", "download"), ("user", "alice"))
    path = f"/download?size={RESPONSE_BYTES}"
    calls = rls_calls(gw)  # nothing pending: the warm-up's one call was answered

    first = gw.call(path, "alice")
    assert first.status == 200, f"{first}\n{gw.logs()}"
    assert len(first.body) == RESPONSE_BYTES
    # Request call: hits_addend 0 checks the budget without charging it.
    assert first.int_header("x-ratelimit-remaining") == DOWNLOAD_BYTES
    assert (f'{DOWNLOAD_BYTES};w={HOUR};name="download_bytes_per_user"'
            in first.headers["x-ratelimit-limit"])
    # Stream-done call: %BYTES_SENT% = the response body, charged after the response.
    wait_used(gw, budget, RESPONSE_BYTES)

    # 600 of 1000 used: the check passes, although this response takes alice over.
    second = gw.call(path, "alice")
    assert second.status == 200, f"{second}\n{gw.logs()}"
    assert second.int_header("x-ratelimit-remaining") == DOWNLOAD_BYTES - RESPONSE_BYTES
    # `charge: always`: the stream-done charge is recorded even though it is over the limit.
    wait_used(gw, budget, 2 * RESPONSE_BYTES)

    third = gw.call(path, "alice")
    assert_limited(third, DOWNLOAD_BYTES, gw)
    assert third.int_header("retry-after") in range(1, HOUR + 1)
    # The 429 has no body: its stream-done call (3 requests x 2 calls) charges 0 bytes.
    wait_for(lambda: rls_calls(gw) == calls + 6, 5.0, "the rejected request's stream-done call",
             alive=gw.envoy.alive, log=gw.logs)
    assert gw.rls_used(*budget) == 2 * RESPONSE_BYTES

    # The budget is per user.
    other = gw.call(path, "bob")
    assert other.status == 200, f"{other}\n{gw.logs()}"
    assert other.int_header("x-ratelimit-remaining") == DOWNLOAD_BYTES
    wait_used(gw, (("api", "download"), ("user", "bob")), RESPONSE_BYTES)

    served = [s.headers.get("x-client-id") for s in gw.backend.seen()
              if s.path.startswith("/download")]
    assert served == ["alice", "alice", "bob"]
