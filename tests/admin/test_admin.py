"""Admin HTTP API of a real `rls serve` process (DESIGN §8, ratelimit-compat §4.2)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

CONFIG = """
domain: adm
descriptors:
  - key: k
    value: v
    rate_limit: {unit: year, requests_per_unit: 2}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: s
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 7}
  - key: q
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 9}
  - key: app
    descriptors:
      - key: path
        value: /items
        rate_limit: {unit: minute, requests_per_unit: 30}
  - key: named
    rate_limit: {name: nm, unit: minute, requests_per_unit: 4}
"""

# `<fullkey>: unit=<UNIT> requests_per_unit=<n>, shadow_mode: <bool>, quota_mode: <bool>`
RLCONFIG_LINE = re.compile(
    r"^(?P<key>\S+): unit=(?P<unit>[A-Z]+) requests_per_unit=(?P<rpu>\d+), "
    r"shadow_mode: (?P<shadow>true|false), quota_mode: (?P<quota>true|false)"
)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_post(url: str, body: bytes, timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@pytest.fixture
def server(rls_factory, tmp_path: Path):
    path = tmp_path / "adm.yaml"
    path.write_text(CONFIG)
    return rls_factory(path)


def limit_samples(text: str) -> dict[tuple[str, str], float]:
    """{(metric family, key label): value} for the per-limit counters."""
    out = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("rls_limit_"):
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                out[(family.name, sample.labels.get("key", ""))] = sample.value
    return out


def test_healthcheck_and_rlconfig(server):
    status, body = http_get(server.http_url + "/healthcheck")
    assert status == 200 and body.strip() == b"OK"

    status, body = http_get(server.http_url + "/rlconfig")
    assert status == 200
    lines = [ln for ln in body.decode().splitlines() if ln.strip()]
    parsed = {}
    for line in lines:
        m = RLCONFIG_LINE.match(line)
        assert m, f"not in the reference format: {line!r}"
        parsed[m["key"]] = (m["unit"], int(m["rpu"]), m["shadow"], m["quota"])
    assert parsed == {
        "adm.k_v": ("YEAR", 2, "false", "false"),
        "adm.user": ("SECOND", 5, "false", "false"),
        "adm.s": ("HOUR", 7, "true", "false"),
        "adm.q": ("DAY", 9, "false", "true"),
        "adm.app.path_/items": ("MINUTE", 30, "false", "false"),
        "adm.named": ("MINUTE", 4, "false", "false"),
    }
    # A plain limit's line is exactly the reference line (no trailing extras).
    assert "adm.k_v: unit=YEAR requests_per_unit=2, shadow_mode: false, quota_mode: false" \
        in lines
    assert "adm.s: unit=HOUR requests_per_unit=7, shadow_mode: true, quota_mode: false" in lines


def test_json_and_metrics(server):
    url = server.http_url + "/json"
    body = json.dumps({
        "domain": "adm",
        "descriptors": [{"entries": [{"key": "k", "value": "v"}]}],
    }).encode()
    for expected_remaining in (1, 0):
        status, headers, raw = http_post(url, body)
        assert status == 200, raw
        assert headers.get("Content-Type", "").startswith("application/json")
        payload = json.loads(raw)
        assert payload["overallCode"] == "OK"
        st = payload["statuses"][0]
        assert st.get("code") == "OK"
        assert int(st.get("limitRemaining", 0)) == expected_remaining
        assert st["currentLimit"]["requestsPerUnit"] == 2
        assert st["currentLimit"]["unit"] == "YEAR"
    status, headers, raw = http_post(url, body)
    assert status == 429, raw
    payload = json.loads(raw)
    assert payload["overallCode"] == "OVER_LIMIT"
    assert payload["statuses"][0]["code"] == "OVER_LIMIT"

    # A weighted call on another limit.
    weighted = json.dumps({
        "domain": "adm",
        "hitsAddend": 3,
        "descriptors": [{"entries": [{"key": "app", "value": "a"},
                                     {"key": "path", "value": "/items"}]}],
    }).encode()
    status, _, raw = http_post(url, weighted)
    assert status == 200, raw
    assert int(json.loads(raw)["statuses"][0]["limitRemaining"]) == 27

    # Unknown domain: OK.
    status, _, raw = http_post(url, json.dumps({
        "domain": "nope", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}],
    }).encode())
    assert status == 200 and json.loads(raw)["overallCode"] == "OK"

    status, text = http_get(server.http_url + "/metrics")
    assert status == 200
    samples = limit_samples(text.decode())
    assert samples[("rls_limit_total_hits", "adm.k_v")] == 3
    assert samples[("rls_limit_within_limit", "adm.k_v")] == 2
    assert samples[("rls_limit_over_limit", "adm.k_v")] == 1
    # limit 2: near threshold floor(1.6) = 1, so only the second hit is near.
    assert samples[("rls_limit_near_limit", "adm.k_v")] == 1
    assert samples[("rls_limit_total_hits", "adm.app.path_/items")] == 3
    assert samples[("rls_limit_within_limit", "adm.app.path_/items")] == 3
    assert samples.get(("rls_limit_over_limit", "adm.app.path_/items"), 0) == 0
    # Limits that saw no traffic have not moved.
    assert samples.get(("rls_limit_total_hits", "adm.user"), 0) == 0


BAD_BODIES = {
    "empty": b"",
    "blank": b"   ",
    "bad json": b"{not json",
    "no descriptors": b'{"domain": "adm"}',
    "empty domain":
        b'{"domain": "", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}',
    "empty key":
        b'{"domain": "adm", "descriptors": [{"entries": [{"key": "", "value": "v"}]}]}',
    "unknown field": b'{"domain": "adm", "nosuchfield": 1}',
}


def test_json_bad_bodies_are_400(server):
    check = json.dumps({
        "domain": "adm",
        "descriptors": [{"entries": [{"key": "k", "value": "v"}], "hitsAddend": "0"}],
    }).encode()
    problems = []
    for name, body in BAD_BODIES.items():
        status, _, raw = http_post(server.http_url + "/json", body)
        if status != 400:
            problems.append(f"{name}: HTTP {status} {raw[:200]!r}")
        # Nothing was charged by the bad call (a 0-hit check sees the full limit of 2).
        status, _, raw = http_post(server.http_url + "/json", check)
        left = int(json.loads(raw)["statuses"][0].get("limitRemaining", 0))
        if status != 200 or left != 2:
            problems.append(f"{name}: after it, check gave HTTP {status}, remaining {left}")
    assert not problems, "\n".join(problems)
