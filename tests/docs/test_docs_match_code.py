"""Issue 18 item 4: what the docs state about the code is what the code does.

Each test reads the statement from the document and checks it against the running code, so a
change on either side without the other fails here.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from support.rls_cli import ROOT

from rls.response_cache.config import load_cache_config
from rls.stores.redis.urls import normalize_redis_url

MIGRATION = (ROOT / "docs" / "migration.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")
RELIABILITY = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")

CONFIG = """domain: dm
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: free
    rate_limit: {unlimited: true}
"""


def test_migration_reference_redis_variables_are_read_as_documented() -> None:
    assert "rejected at startup" not in MIGRATION
    for var in ("REDIS_TYPE", "REDIS_SOCKET_TYPE", "REDIS_AUTH"):
        not_supported = MIGRATION.split("## Not supported", 1)[1].split("\n## ", 1)[0]
        assert var not in not_supported, var
    assert normalize_redis_url("host:6379", {}) == "redis://host:6379"
    assert normalize_redis_url("host:6379", {"REDIS_SOCKET_TYPE": "tcp", "REDIS_AUTH": "pw"}) \
        == "redis://:pw@host:6379"
    assert "`redis+sentinel://s1:26379,s2:26379/master`" in MIGRATION
    assert normalize_redis_url("master,s1:26379,s2:26379", {"REDIS_TYPE": "sentinel"}) \
        == "redis+sentinel://s1:26379,s2:26379/master"
    assert normalize_redis_url("n1:6379,n2:6379", {"REDIS_TYPE": "cluster"}) \
        == "redis+cluster://n1:6379,n2:6379"


def test_shipped_cache_rules_default_to_the_memory_store() -> None:
    config = load_cache_config(str(ROOT / "config" / "cache.yaml"))
    assert not config.store, config.store  # cache.md: default memory


def test_no_stale_known_defect_in_reliability() -> None:
    assert "Known defect" not in RELIABILITY


def post(url: str, body: bytes) -> tuple[int, object]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def served(rls_factory, redis_url: str, tmp_path: Path):
    cfg = tmp_path / "dm.yaml"
    cfg.write_text(CONFIG)
    return rls_factory(cfg, args=("--redis-url", redis_url))


def test_rlconfig_unlimited_line_and_json_errors_as_documented(served) -> None:
    with urllib.request.urlopen(served.http_url + "/rlconfig", timeout=5) as resp:
        lines = resp.read().decode().splitlines()
    assert "dm.free: unlimited, shadow_mode: false, quota_mode: false" in lines
    assert "`<key>: unlimited, shadow_mode: …`" in MIGRATION
    assert "dm.k: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false" in lines
    status, payload = post(served.http_url + "/json", b"{not json")
    assert status == 400 and isinstance(payload, dict) and "error" in payload
    status, payload = post(served.http_url + "/json", b"")
    assert status == 400 and isinstance(payload, dict) and "error" in payload


def test_readme_counter_value_format(served, redis_server) -> None:
    documented = re.search(r"counts in a key of its own window,\s+`([^`]+)`", README)
    assert documented and documented.group(1) == "<key>@<window index>"
    body = json.dumps({"domain": "dm", "descriptors": [
        {"entries": [{"key": "k", "value": "v"}]}], "hitsAddend": 3}).encode()
    before = int(time.time() * 1000) // 60000
    status, _ = post(served.http_url + "/json", body)
    after = int(time.time() * 1000) // 60000
    assert status == 200
    client = redis_server.client()
    keys = [k for k in client.keys("rl:*") if b"dm|" in k]
    assert len(keys) == 1, keys
    key, index = keys[0].decode().rsplit("@", 1)
    assert key.endswith("|f60") and before <= int(index) <= after
    assert client.get(keys[0]) == b"3"  # the count, an integer
    assert 0 < client.pttl(keys[0]) <= 61_000  # to the window's end + 1 s


def test_migration_states_defaults_and_reference_variables_truthfully() -> None:
    from rls.settings import Settings
    from rls.settings.environment import REFERENCE_ENV
    from rls.settings.reference_env import ENTRY_ENV

    assert f"default {Settings().backend_timeout_ms} ms" in MIGRATION
    assert "default 15 ms" not in MIGRATION
    identical = MIGRATION.split("## Identical", 1)[1].split("\n## ", 1)[0]
    assert "Content-Type" not in identical and "content-type" not in identical.lower()
    different = MIGRATION.split("## Different, and why", 1)[1].split("\n## ", 1)[0]
    assert "`/json`: a POST needs `Content-Type: application/json` (else 415)" in different
    # Read by `rls serve` itself (REFERENCE_ENV), or only by the `/bin/ratelimit` entry.
    assert "FORCE_START_WITHOUT_INITIAL_CONFIG" in REFERENCE_ENV.values()
    row = MIGRATION.split("`FORCE_START_WITHOUT_INITIAL_CONFIG", 1)[1].split("\n", 1)[0]
    assert "read as is" in row and "--allow-empty-config" in row
    assert "GRPC_UDS" in ENTRY_ENV and "GRPC_UDS" not in REFERENCE_ENV.values()
    row = MIGRATION.split("`GRPC_UDS", 1)[1].split("\n", 1)[0]
    assert "read as is by `/bin/ratelimit`" in row and "--grpc-addr unix:" in row
    assert "The reference's default socket type is `unix`" in MIGRATION
    assert normalize_redis_url("host:6379", {}).startswith("redis://")  # tcp, not unix


def test_counters_doc_matches_the_store_and_the_parser() -> None:
    counters = (ROOT / "docs" / "counters.md").read_text(encoding="utf-8")
    assert "exists in the counters API only" not in counters
    assert "`{c: count, k: original key}`" not in counters
    lua = (ROOT / "rls" / "lua" / "counters_window.lua").read_text(encoding="utf-8")
    assert 'if orig ~= "" then' in lua  # `k` only for hashed keys, as counters.md says
    assert "its hash holds `c` only" in counters
    from rls.config.loader import load_files

    config = load_files([("r.yaml", "domain: r\ndescriptors:\n  - key: k\n    rate_limit:\n"
                          "      {unit: hour, requests_per_unit: 1, "
                          "window: rolling_from_first_hit}\n")])
    assert config.domains["r"].root.ordered[0].limits[0].rolling


def test_readme_layout_names_the_packages_where_the_code_is() -> None:
    layout = README.split("## Layout", 1)[1]
    for package in re.findall(r"^(rls/\w+)/", layout, re.M):
        assert (ROOT / package).is_dir(), package
    for module, where in (("admission", "core"), ("keys", "core"), ("limiter", "engine")):
        assert (ROOT / "rls" / where / f"{module}.py").exists()
    core = next(line for line in layout.splitlines() if line.startswith("rls/core/"))
    assert "algorithms" in core and "key encoding" in core and "admission" in core
    engine = next(line for line in layout.splitlines() if line.startswith("rls/engine/"))
    assert "algorithms" not in engine and "admission" not in engine


def test_demo_quota_is_documented() -> None:
    quota = (ROOT / "docs" / "quota-mode.md").read_text(encoding="utf-8")
    assert "`rls demo --quota`" in README and "`rls demo --quota`" in quota


def test_breaker_gauge_values_agree_in_docs_and_code() -> None:
    from rls.process.server import _CIRCUIT_VALUE
    from rls.stores.breaker import CLOSED, HALF_OPEN, OPEN

    breaker = (ROOT / "rls" / "stores" / "breaker.py").read_text(encoding="utf-8")
    assert "_set(HALF_OPEN" not in breaker and "state = HALF_OPEN" not in breaker
    assert (_CIRCUIT_VALUE[CLOSED], _CIRCUIT_VALUE[OPEN]) == (0.0, 1.0)
    assert HALF_OPEN  # named, never entered
    metrics = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    observability = (ROOT / "docs" / "observability.md").read_text(encoding="utf-8")
    for doc in (metrics, observability):
        rows = [line for line in doc.splitlines() if "rls_backend_circuit_open`" in line
                and ("closed" in line or "open" in line)]
        assert rows, doc[:80]
        for row in rows:
            assert "0 closed" in row and "1 open" in row and "0.5" not in row, row
    dashboard = (ROOT / "helm" / "rls" / "files" / "grafana-dashboard.json").read_text()
    assert "0.5 probing" not in dashboard and "0 closed, 1 open" in dashboard
