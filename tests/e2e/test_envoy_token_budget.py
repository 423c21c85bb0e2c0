"""Token budgets through a real Envoy 1.40, stock ratelimit filter (envoy/token-budget.yaml).

The request-time entry checks the tenant's budget with hits_addend 0; the stream-done entry
sends the tokens the response reports (`%RESP(x-tokens-used)%`) after the response, in a
fire-and-forget call whose answer Envoy ignores. That charge must land even when it takes the
tenant past the budget: were it refused (and so not charged), the budget would never read spent
and every later request would pass. Pinned on the memory store and on Redis, with a budget the
charges fill exactly and one they overflow, and with concurrent requests that all pass the
check before any charge lands (every charge must still be counted).

The stream-done call races the test (Envoy sends it after the client has its response), so
every assertion about it polls rls's counter query, never a sleep.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from .harness import (
    Backend,
    Gateway,
    Response,
    wait_for,
)

pytestmark = pytest.mark.envoy

WARMUP_TENANT = "warm-up"
HELD_S = 30.0  # bound of the wait for concurrent requests to reach the backend (a busy host)


def descriptors(budget: int) -> str:
    return f"""\
domain: llm
descriptors:
  - key: tenant
    rate_limit: {{name: tokens_per_tenant, unit: hour, requests_per_unit: {budget}}}
"""



@pytest.fixture
def budget_gateway(
    llm_gateway: Callable[[str, str, float], Gateway],
) -> Callable[[int], Gateway]:
    """Start rls with a per-tenant budget and Envoy on envoy/token-budget.yaml in front of it."""

    def start(budget: int) -> Gateway:
        gw = llm_gateway(descriptors(budget), "token-budget.yaml", HELD_S * 2)
        # Envoy connects to rls lazily: wait for an answer that carries rls's verdict.
        wait_for(lambda: "x-ratelimit-limit" in call(gw, WARMUP_TENANT, 0).headers, 15.0,
                 "a rate-limited answer through Envoy -> rls", alive=gw.envoy.alive,
                 log=gw.logs)
        return gw

    return start


def call(gw: Gateway, tenant: str, tokens: int, path: str = "/v1/chat") -> Response:
    # A held request waits for the others: the client's timeout outlasts that wait's bound.
    return gw.envoy.request("GET", f"{path}?tokens={tokens}", headers={"x-tenant": tenant},
                            timeout=HELD_S + 10)


def used(gw: Gateway, tenant: str) -> int:
    return gw.rls_used(("tenant", tenant))


def wait_used(gw: Gateway, tenant: str, expected: int) -> None:
    wait_for(lambda: used(gw, tenant) == expected, 10.0,
             f"rls counter of {tenant} == {expected} (now {used(gw, tenant)})",
             alive=gw.envoy.alive, log=gw.logs)


def assert_refused(resp: Response, gw: Gateway) -> None:
    assert resp.status == 429, f"{resp}\n{gw.logs()}"
    assert resp.headers.get("x-envoy-ratelimited") == "true", resp.headers


def test_charges_that_fill_the_budget_exactly_spend_it(
    budget_gateway: Callable[[int], Gateway],
) -> None:
    gw = budget_gateway(2000)
    for n in range(1, 5):
        resp = call(gw, "acme", 500)
        assert resp.status == 200, f"{resp}\n{gw.logs()}"
        # The request-time check saw what the earlier responses charged.
        assert resp.int_header("x-ratelimit-remaining") == 2000 - 500 * (n - 1)
        wait_used(gw, "acme", 500 * n)
    # 2000 of 2000 used: the check-only call answers OVER_LIMIT (no room for one more token).
    assert_refused(call(gw, "acme", 500), gw)
    assert used(gw, "acme") == 2000
    assert call(gw, "other", 500).status == 200, "the budget is per tenant"


def test_a_charge_that_overflows_the_budget_lands_and_the_next_request_is_refused(
    budget_gateway: Callable[[int], Gateway],
) -> None:
    gw = budget_gateway(2000)
    for n in range(1, 4):
        resp = call(gw, "acme", 700)
        assert resp.status == 200, f"{resp}\n{gw.logs()}"
        wait_used(gw, "acme", 700 * n)
    # The third response took acme to 2100 of 2000: charged although over, so the budget is
    # spent and every later request is refused (not admitted forever).
    assert used(gw, "acme") == 2100
    for _ in range(3):
        assert_refused(call(gw, "acme", 700), gw)
    assert used(gw, "acme") == 2100, "a refused request reports no tokens: nothing charged"


def test_every_stream_done_charge_of_concurrent_requests_is_counted(
    budget_gateway: Callable[[int], Gateway], backend: Backend,
) -> None:
    """20 requests of 800 tokens against 10,000: all pass the check before any charge lands
    (the backend holds them until all 20 arrived), so all 16,000 tokens must be counted."""
    gw = budget_gateway(10_000)
    gate = backend.hold("/v1/batch")
    with ThreadPoolExecutor(max_workers=20) as pool:
        futures = [pool.submit(call, gw, "acme", 800, f"/v1/batch/{i}") for i in range(20)]
        wait_for(lambda: sum(s.path.startswith("/v1/batch") for s in backend.seen()) == 20,
                 HELD_S, "20 requests held at the backend", alive=gw.envoy.alive, log=gw.logs)
        gate.open()
        answers = [f.result(timeout=HELD_S) for f in futures]
    assert [a.status for a in answers] == [200] * 20, gw.logs()
    wait_used(gw, "acme", 16_000)
    assert_refused(call(gw, "acme", 800), gw)
