"""RLS_ADMIN_TOKEN: mutating admin endpoints and /json need `Authorization: Bearer <token>`;
reads stay open; the CLI sends the token from its environment (README "Admin API")."""

from __future__ import annotations

import pytest
from support.calls import AUTH, TOKEN, Grpc, cli, http, item, uid, used

pytestmark = pytest.mark.parametrize("srv", ["memory"], indirect=True)

OFF = {"shadow_mode": False, "limiting_off": False, "shadow_domains": []}

WRONG = {
    "no header": {},
    "wrong token": {"Authorization": "Bearer nope"},
    "token prefix": {"Authorization": "Bearer s3cre"},
    "token with suffix": {"Authorization": f"Bearer {TOKEN}x"},
    "other scheme": {"Authorization": f"Basic {TOKEN}"},
    "bare token": {"Authorization": TOKEN},
    "empty bearer": {"Authorization": "Bearer "},
    "token as another header": {"X-Admin-Token": TOKEN},
    # Any wrong credential is a 401, including one with non-ASCII characters.
    "non-ascii token": {"Authorization": "Bearer s\u00e9cret"},
}


@pytest.mark.parametrize("case", list(WRONG))
def test_mutations_need_the_token(switches_reset, case):
    srv = switches_reset
    v = uid()
    body = {"items": [item("ops", [("k", v)])]}
    status, payload = http(srv.http_url, "POST", "/add", body, headers=WRONG[case])
    assert status == 401, f"/add with {case}: HTTP {status} {payload}"
    status, payload = http(
        srv.http_url, "POST", "/switches", {"limiting_off": True}, headers=WRONG[case]
    )
    assert status == 401, f"/switches with {case}: HTTP {status} {payload}"
    # Nothing happened.
    assert used(srv.http_url, "ops", [("k", v)]) == 0
    assert http(srv.http_url, "GET", "/switches") == (200, OFF)


def test_right_token_is_accepted(switches_reset):
    srv = switches_reset
    v = uid()
    status, payload = http(
        srv.http_url, "POST", "/add", {"items": [item("ops", [("k", v)], hits=2)]}, headers=AUTH
    )
    assert status == 200, payload
    assert used(srv.http_url, "ops", [("k", v)]) == 2
    status, payload = http(srv.http_url, "POST", "/switches", {"limiting_off": True}, headers=AUTH)
    assert status == 200, payload
    assert http(srv.http_url, "GET", "/switches")[1]["limiting_off"] is True


def test_reads_stay_open(srv):
    v = uid()
    with Grpc(srv.grpc_addr) as client:
        client.one("ops", ("k", v))
    status, payload = http(
        srv.http_url, "POST", "/counters",
        {"domain": "ops", "descriptors": [{"entries": [{"key": "k", "value": v}]}]},
    )
    assert status == 200 and payload["results"][0]["limits"][0]["used"] == 1, payload
    assert http(srv.http_url, "GET", "/switches")[0] == 200
    assert http(srv.http_url, "GET", "/usage?domain=usage&app=x")[0] == 200
    assert http(srv.http_url, "GET", "/metrics")[0] == 200
    assert http(srv.http_url, "GET", "/healthcheck") == (200, "OK")
    assert http(srv.http_url, "GET", "/rlconfig")[0] == 200
    assert http(srv.http_url, "GET", "/rlconfig?format=json")[0] == 200
    # /json charges counters (as Envoy's calls do), so it needs the token like /add.
    request = {"domain": "ops", "descriptors": [{"entries": [{"key": "k", "value": v}]}]}
    assert http(srv.http_url, "POST", "/json", request)[0] == 401
    assert used(srv.http_url, "ops", [("k", v)]) == 1
    status, payload = http(srv.http_url, "POST", "/json", request, headers=AUTH)
    assert status == 200 and payload["overallCode"] == "OK", payload


def test_cli_takes_the_token_from_the_environment(switches_reset):
    srv = switches_reset
    v = uid()
    base = ("counters", "--admin", srv.http_url, "--domain", "ops", "-d", f"k={v}", "--add", "2")
    denied = cli(*base)
    assert denied.returncode != 0, denied.stdout
    assert "token" in denied.stdout + denied.stderr
    assert used(srv.http_url, "ops", [("k", v)]) == 0

    allowed = cli(*base, env={"RLS_ADMIN_TOKEN": TOKEN})
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert used(srv.http_url, "ops", [("k", v)]) == 2
    # (`rls switches` with the token from the environment: test_switches.py)
