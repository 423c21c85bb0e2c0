"""Token budgets that cannot be overshot, through a real Envoy 1.40 and its stock ratelimit
filter (envoy/token-budget-reserve.yaml, copied in docs/token-budgets.md).

The request-time entry reserves the request's estimate (`%REQ(x-max-tokens)%`) with the request
id as an entry; the stream-done entry adds a fixed `settle` entry and sends the tokens the
response reports. rls charges the estimate all-or-nothing, so concurrent requests cannot
together pass the budget, and settles each reservation at stream end. On the memory store and
on Redis.

The stream-done call races the test (Envoy sends it after the client has its answer), so every
assertion about it polls rls's counter query or metrics, never a sleep.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from support.calls import Grpc, descriptor, request

from .harness import (
    Backend,
    Gateway,
    Response,
    wait_for,
)

pytestmark = pytest.mark.envoy

WARMUP_TENANT = "warm-up"
HELD_S = 30.0  # bound of the wait for concurrent requests to reach the backend (a busy host)


def descriptors(budget: int, expire: str = "600s", estimate: str = "") -> str:
    return f"""\
domain: llm
descriptors:
  - key: tenant
    rate_limit:
      name: tokens_per_tenant
      unit: hour
      requests_per_unit: {budget}
      reserve: {{id_key: request_id, settle_key: settle, expire_after: {expire}{estimate}}}
"""


@pytest.fixture
def reserve_gateway(
    llm_gateway: Callable[[str, str, float], Gateway],
) -> Callable[..., Gateway]:
    """rls with a per-tenant reserve budget, Envoy on envoy/token-budget-reserve.yaml."""

    def start(budget: int, **rls_yaml: str) -> Gateway:
        gw = llm_gateway(descriptors(budget, **rls_yaml), "token-budget-reserve.yaml",
                         HELD_S * 2)
        wait_for(lambda: "x-ratelimit-limit" in call(gw, WARMUP_TENANT, 1, 1).headers, 15.0,
                 "a rate-limited answer through Envoy -> rls", alive=gw.envoy.alive,
                 log=gw.logs)
        wait_metric(gw, "rls_reservations_open", 0)  # the warm-up's settled: counts start here
        return gw

    return start


def call(
    gw: Gateway, tenant: str, estimate: int, tokens: int | None, path: str = "/v1/chat"
) -> Response:
    """A request with its estimate (x-max-tokens); its response reports `tokens` (None: no
    x-tokens-used header, so Envoy sends no stream-done call)."""
    query = "" if tokens is None else f"?tokens={tokens}"
    return gw.envoy.request("GET", path + query, timeout=HELD_S + 10,
                            headers={"x-tenant": tenant, "x-max-tokens": str(estimate)})


def used(gw: Gateway, tenant: str) -> int:
    return gw.rls_used(("tenant", tenant))


def wait_used(gw: Gateway, tenant: str, expected: int) -> None:
    wait_for(lambda: used(gw, tenant) == expected, 10.0,
             f"rls counter of {tenant} == {expected} (now {used(gw, tenant)})",
             alive=gw.envoy.alive, log=gw.logs)


def wait_metric(gw: Gateway, name: str, expected: float, within: float = 10.0) -> None:
    wait_for(lambda: gw.rls_metric(name) == expected, within,
             f"{name} == {expected} (now {gw.rls_metric(name)})", alive=gw.envoy.alive,
             log=gw.logs)


def test_concurrent_requests_cannot_together_pass_the_budget(
    reserve_gateway: Callable[..., Gateway], backend: Backend,
) -> None:
    """20 requests estimating 800 against 10,000 at once: 12 reservations fit (9,600), the
    other 8 are refused at once; while the 12 stream, the counter never passes the budget;
    their settles then bring it to what they used."""
    gw = reserve_gateway(10_000)
    gate = backend.hold("/v1/batch")
    with ThreadPoolExecutor(max_workers=20) as pool:
        futures = [pool.submit(call, gw, "acme", 800, 500, f"/v1/batch/{i}") for i in range(20)]
        wait_for(lambda: sum(f.done() for f in futures) == 8, HELD_S,
                 "8 requests refused while 12 are held", alive=gw.envoy.alive, log=gw.logs)
        assert [f.result().status for f in futures if f.done()] == [429] * 8
        assert used(gw, "acme") == 9_600
        gate.open()
        answers = [f.result(timeout=HELD_S) for f in futures]
    assert sorted(a.status for a in answers) == [200] * 12 + [429] * 8, gw.logs()
    wait_used(gw, "acme", 12 * 500)
    wait_metric(gw, "rls_reservations_open", 0)


def test_settle_charges_the_difference_or_releases_it(
    reserve_gateway: Callable[..., Gateway],
) -> None:
    gw = reserve_gateway(2_000)
    assert call(gw, "acme", 800, 300).status == 200
    wait_used(gw, "acme", 300)  # 500 of the estimate given back
    assert call(gw, "acme", 800, 1_200).status == 200
    wait_used(gw, "acme", 1_500)  # 400 beyond the estimate charged
    # 500 left: an estimate of 800 does not fit, one of 500 does.
    assert call(gw, "acme", 800, 100).status == 429
    assert call(gw, "acme", 500, 500).status == 200
    wait_used(gw, "acme", 2_000)


def test_a_repeated_settle_changes_nothing(
    reserve_gateway: Callable[..., Gateway], backend: Backend,
) -> None:
    gw = reserve_gateway(2_000)
    settled = gw.rls_metric("rls_reservations_settled_total")
    assert call(gw, "acme", 800, 300, "/v1/once").status == 200
    wait_used(gw, "acme", 300)
    (seen,) = [s for s in backend.seen() if s.path.startswith("/v1/once")]
    rid = seen.headers["x-request-id"]
    # Envoy's stream-done call once more (a retry, another replica): nothing changes.
    settle = descriptor(("tenant", "acme"), ("request_id", rid), ("settle", "1"), hits=300)
    client = Grpc(gw.rls.grpc_addr)
    for _ in range(2):
        client.stub.ShouldRateLimit(request("llm", settle), timeout=5)
    assert used(gw, "acme") == 300
    assert gw.rls_metric("rls_reservations_settled_total") == settled + 1
    assert gw.rls_metric("rls_settles_without_reservation_total") == 0


def test_an_unsettled_reservation_expires_keeping_its_estimate(
    reserve_gateway: Callable[..., Gateway],
) -> None:
    """A response without x-tokens-used: Envoy drops the stream-done descriptor, so the
    reservation is never settled. It expires after expire_after with its estimate charged."""
    gw = reserve_gateway(2_000, expire="2s")
    before = gw.rls_metric("rls_reservations_expired_total")
    assert call(gw, "acme", 800, None).status == 200
    assert used(gw, "acme") == 800
    wait_for(lambda: gw.rls_metric("rls_reservations_expired_total") >= before + 1, 15.0,
             "the reservation expired", alive=gw.envoy.alive, log=gw.logs)
    wait_metric(gw, "rls_reservations_open", 0)
    assert used(gw, "acme") == 800


def test_a_fixed_estimate_in_rls_replaces_the_request_time_hits_addend(
    reserve_gateway: Callable[..., Gateway],
) -> None:
    """`estimate: 800` in rls's YAML: whatever x-max-tokens says, 800 is held, then settled."""
    gw = reserve_gateway(2_000, estimate=", estimate: 800")
    settled = gw.rls_metric("rls_reservations_settled_total")
    assert call(gw, "acme", 1, 300).status == 200
    wait_used(gw, "acme", 300)  # 800 held, 500 given back
    assert call(gw, "acme", 1, 300).status == 200
    wait_used(gw, "acme", 600)
    assert gw.rls_metric("rls_reservations_settled_total") == settled + 2
    assert gw.rls_metric("rls_settles_without_reservation_total") == 0
    assert gw.rls_metric("rls_reservations_unrecorded_total") == 0
