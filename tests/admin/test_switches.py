"""Runtime switches (README settings table, "Admin API", "Operating it" / Workers):
global shadow, limiting off, per-domain shadow; where their state shows; the start-up env;
propagation between `--workers`."""

from __future__ import annotations

import json
import time
from pathlib import Path

from support.calls import (
    AUTH,
    OK,
    OVER,
    TOKEN,
    Grpc,
    cli,
    delta,
    http,
    scrape,
    uid,
    used,
    value,
)

SW_CONFIG = """
domain: sw1
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1}
"""


def post(srv, body, headers=AUTH):
    return http(srv.http_url, "POST", "/switches", body, headers=headers)


def over_limit_value(client: Grpc, domain: str = "sw1") -> str:
    """A fresh value of `k` (limit 1 per hour) that has just used its one call."""
    v = uid()
    assert client.one(domain, ("k", v)).overall_code == OK
    return v


def test_limiting_off_answers_ok_and_keeps_counting(switches_reset):
    srv = switches_reset
    with Grpc(srv.grpc_addr) as client:
        v = over_limit_value(client)
        assert client.one("sw1", ("k", v)).overall_code == OVER
        assert post(srv, {"limiting_off": True})[0] == 200
        before = scrape(srv.http_url)
        codes = [client.one("sw1", ("k", v)).overall_code for _ in range(3)]
        assert codes == [OK] * 3
        # A fresh counter is still charged while limiting is off.
        w = uid()
        assert client.one("sw1", ("k", w)).overall_code == OK
        assert client.one("sw1", ("k", w)).overall_code == OK
        after = scrape(srv.http_url)
        assert used(srv.http_url, "sw1", [("k", w)]) == 1
        assert used(srv.http_url, "sw1", [("k", v)]) == 1
        assert delta(before, after, "rls_limit_total_hits_total", key="sw1.k") == 5
        assert delta(before, after, "rls_limit_over_limit_total", key="sw1.k") == 4
        answered_ok = delta(before, after, "rls_requests_total", domain="sw1", code="OK")
        counted_over = delta(before, after, "rls_requests_total", domain="sw1", code="OVER_LIMIT")
        assert (answered_ok, counted_over) == (5, 0), (
            f"{srv.backend}: 5 calls answered OK; rls_requests_total{{domain=sw1}} moved by "
            f"{answered_ok} for code=OK and {counted_over} for code=OVER_LIMIT"
        )
        assert post(srv, {"limiting_off": False})[0] == 200
        assert client.one("sw1", ("k", v)).overall_code == OVER


def test_global_shadow_mode(switches_reset):
    srv = switches_reset
    with Grpc(srv.grpc_addr) as client:
        v = over_limit_value(client)
        assert post(srv, {"shadow_mode": True})[0] == 200
        before = scrape(srv.http_url)
        for _ in range(3):
            resp = client.one("sw1", ("k", v))
            assert resp.overall_code == OK
            assert resp.statuses[0].code == OVER
        after = scrape(srv.http_url)
        moved = delta(before, after, "rls_global_shadow_mode_total")
        assert moved == 3, (
            f"{srv.backend}: 3 calls turned OK by the global shadow switch, "
            f"rls_global_shadow_mode_total moved by {moved}"
        )
        assert delta(before, after, "rls_limit_over_limit_total", key="sw1.k") == 3
        assert post(srv, {"shadow_mode": False})[0] == 200
        assert client.one("sw1", ("k", v)).overall_code == OVER


def test_shadow_domains_affect_only_those_domains(switches_reset):
    srv = switches_reset
    with Grpc(srv.grpc_addr) as client:
        v1 = over_limit_value(client, "sw1")
        v2 = over_limit_value(client, "sw2")
        status, state = post(srv, {"shadow_domains": ["sw1"]})
        assert status == 200 and state["shadow_domains"] == ["sw1"], state
        r1 = client.one("sw1", ("k", v1))
        r2 = client.one("sw2", ("k", v2))
        assert (r1.overall_code, r1.statuses[0].code) == (OK, OVER)
        assert (r2.overall_code, r2.statuses[0].code) == (OVER, OVER)
        assert post(srv, {"shadow_domains": []})[0] == 200
        assert client.one("sw1", ("k", v1)).overall_code == OVER


INVALID = {
    "not json": b"{nope",
    "empty body": b"",
    "a list": b"[]",
    "null": b"null",
    "string bool": b'{"shadow_mode": "true"}',
    "number bool": b'{"limiting_off": 1}',
    "null bool": b'{"shadow_mode": null}',
    "domains not a list": b'{"shadow_domains": "sw1"}',
    "domains of numbers": b'{"shadow_domains": [1]}',
    "unknown field": b'{"shadow": true}',
    "one good one bad": b'{"shadow_mode": true, "limiting_off": "yes"}',
}


def test_invalid_bodies_are_400_and_change_nothing(switches_reset):
    srv = switches_reset
    problems = []
    for name, raw in INVALID.items():
        status, payload = http(srv.http_url, "POST", "/switches", raw=raw, headers=AUTH)
        if status != 400:
            problems.append(f"{name}: HTTP {status} {payload}")
        state = http(srv.http_url, "GET", "/switches")[1]
        if state != {"shadow_mode": False, "limiting_off": False, "shadow_domains": []}:
            problems.append(f"{name}: switches changed to {state}")
    assert not problems, "\n".join(problems)


def test_state_is_visible_everywhere(switches_reset):
    srv = switches_reset
    status, state = post(srv, {"shadow_mode": True, "shadow_domains": ["sw2", "sw1"]})
    expected = {"shadow_mode": True, "limiting_off": False, "shadow_domains": ["sw1", "sw2"]}
    assert (status, state) == (200, expected)
    # A partial update keeps the other fields.
    status, state = post(srv, {"limiting_off": True})
    expected["limiting_off"] = True
    assert (status, state) == (200, expected)
    assert http(srv.http_url, "GET", "/switches") == (200, expected)
    status, dump = http(srv.http_url, "GET", "/rlconfig?format=json")
    assert status == 200 and dump["switches"] == expected, dump
    samples = scrape(srv.http_url)
    assert value(samples, "rls_switch", name="shadow_mode") == 1
    assert value(samples, "rls_switch", name="limiting_off") == 1
    assert value(samples, "rls_switch", name="shadow_domains") == 2

    off = {"shadow_mode": False, "limiting_off": False, "shadow_domains": []}
    if srv.backend == "memory":  # the CLI is the same client whatever the backend
        out = cli("switches", "--admin", srv.http_url)
        assert out.returncode == 0 and json.loads(out.stdout) == expected, out.stdout + out.stderr
        out = cli(
            "switches", "--admin", srv.http_url, "--shadow-mode", "off", "--limiting-off", "off",
            "--shadow-domains", "", env={"RLS_ADMIN_TOKEN": TOKEN},
        )
        assert out.returncode == 0 and json.loads(out.stdout) == off, out.stdout + out.stderr
    else:
        assert post(srv, off) == (200, off)
    samples = scrape(srv.http_url)
    assert [value(samples, "rls_switch", name=n) for n in
            ("shadow_mode", "limiting_off", "shadow_domains")] == [0, 0, 0]
    assert http(srv.http_url, "GET", "/rlconfig?format=json")[1]["switches"] == off


def test_shadow_mode_from_the_environment(spawner, tmp_path: Path):
    config = tmp_path / "sw.yaml"
    config.write_text(SW_CONFIG)
    srv = spawner(config, env={"RLS_SHADOW_MODE": "true"})
    state = http(srv.http_url, "GET", "/switches")[1]
    assert state == {"shadow_mode": True, "limiting_off": False, "shadow_domains": []}
    assert value(scrape(srv.http_url), "rls_switch", name="shadow_mode") == 1
    assert http(srv.http_url, "GET", "/rlconfig?format=json")[1]["switches"] == state
    with Grpc(srv.grpc_addr) as client:
        assert client.one("sw1", ("k", "v")).overall_code == OK
        resp = client.one("sw1", ("k", "v"))
        assert (resp.overall_code, resp.statuses[0].code) == (OK, OVER)


def _settled(url: str, expected: dict, deadline: float, streak: int = 30) -> float | None:
    """Start time of the first run of `streak` consecutive GET /switches on fresh connections
    (spread over the workers by SO_REUSEPORT) that all showed `expected`; None if no such run
    ends before `deadline`."""
    run, start = 0, 0.0
    while time.monotonic() < deadline:
        sent = time.monotonic()
        status, state = http(url, "GET", "/switches", timeout=2)
        if (status, state) == (200, expected):
            start = start if run else sent
            run += 1
        else:
            run = 0
        if run >= streak:
            return start
    return None


def test_switch_reaches_every_worker(workers_srv):
    srv = workers_srv
    off = {"shadow_mode": False, "limiting_off": False, "shadow_domains": []}
    assert _settled(srv.http_url, off, time.monotonic() + 20) is not None
    for change in ({"limiting_off": True, "shadow_domains": ["sw1"]},
                   {"limiting_off": False, "shadow_domains": []}):
        status, state = http(srv.http_url, "POST", "/switches", change)
        assert status == 200, state
        posted = time.monotonic()
        expected = {**off, **change}
        seen = _settled(srv.http_url, expected, posted + 10)
        assert seen is not None, f"{change} never seen consistently by every worker"
        assert seen - posted <= 2.0, f"{change}: every worker saw it after {seen - posted:.2f} s"
