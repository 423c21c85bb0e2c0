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

from rls.cache.config import load_cache_config
from rls.stores.urls import normalize_redis_url

from .helpers import ROOT

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
