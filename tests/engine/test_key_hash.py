"""`key_hash: md5|xxh3` on a rate-limit domain: fixed-length counter keys (rls/core/keys.py).

Keys keep the prefix, the domain and the limit ident, carry a 128-bit digest of the descriptor
part, and never equal a plain or long-key-hashed key. The admin `/counters` query and `/usage`
still answer by descriptor (they compute the key from the request: nothing extra is stored).
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

import rls.core.keys as keys
from rls.config.errors import ConfigError
from rls.config.loader import load_files
from rls.core.keys import counter_key
from rls.engine.limiter import OK, OVER_LIMIT, DescriptorIn, RateLimiter
from rls.observability.metrics import Metrics
from rls.settings import Settings
from rls.stores.redis import RedisBackend


def http(url: str, body: bytes | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(
        url, data=body, method="POST" if body is not None else "GET",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


CONFIG = """
domain: hk
key_hash: md5
usage_stats:
  calls: ["app"]
descriptors:
  - key: app
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 2}
  - key: sms
    rate_limit: {unit: day, requests_per_unit: 5, window: rolling_from_first_hit}
"""


def test_hashed_keys_have_a_fixed_length_and_keep_domain_and_ident() -> None:
    short = counter_key("rl:", "hk", [("app", "a"), ("user", "u")], "f3600", "md5")
    long = counter_key("rl:", "hk", [("app", "a" * 900), ("user", "😀" * 300)], "f3600", "md5")
    assert len(short) == len(long)
    assert short.startswith("rl:hk|#md5:") and short.endswith("|f3600")
    digest = short.removeprefix("rl:hk|#md5:").removesuffix("|f3600")
    assert digest == hashlib.md5(b"app|a|user|u").hexdigest()


def test_hashed_keys_never_meet_plain_or_long_keys() -> None:
    parts = [("k", "v" * 400)]
    hashed = counter_key("rl:", "d", parts, "f60", "md5")
    assert hashed != counter_key("rl:", "d", parts, "f60")  # the long-key (blake2b) form
    assert "|#md5:" not in counter_key("rl:", "d", [("k", "#md5:x")], "f60")  # `#` escaped
    # Separators inside values cannot make two descriptors one digest input.
    assert counter_key("rl:", "d", [("a_b", "c")], "f60", "md5") != counter_key(
        "rl:", "d", [("a", "b_c")], "f60", "md5"
    )
    assert counter_key("rl:", "d", [("a|b", "c")], "f60", "md5") != counter_key(
        "rl:", "d", [("a", "b|c")], "f60", "md5"
    )


def test_xxh3_keys_use_the_xxhash_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keys, "_xxh3", lambda data: hashlib.md5(data).hexdigest()[::-1])
    xxh = counter_key("rl:", "d", [("k", "v")], "f60", "xxh3")
    assert xxh != counter_key("rl:", "d", [("k", "v")], "f60", "md5")
    assert xxh.startswith("rl:d|#xxh3:") and len(xxh.split(":")[-1].split("|")[0]) == 32


@pytest.mark.parametrize(
    ("value", "message"),
    [("sha1", "key_hash must be one of md5, xxh3, not 'sha1'"), ("MD5", "not 'MD5'")],
)
def test_bad_key_hash_is_a_located_error(value: str, message: str) -> None:
    text = f"domain: hk\nkey_hash: {value}\ndescriptors: []\n"
    with pytest.raises(ConfigError) as err:
        load_files([("hk.yaml", text)])
    assert message in str(err.value)
    assert err.value.line == 2


def test_xxh3_without_the_xxhash_package_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keys, "_xxh3", None)
    with pytest.raises(ConfigError, match="xxhash") as err:
        load_files([("hk.yaml", "domain: hk\nkey_hash: xxh3\ndescriptors: []\n")])
    assert err.value.line == 2


def test_merged_files_of_a_domain_must_agree_on_key_hash() -> None:
    a = ("a.yaml", "domain: hk\nkey_hash: md5\ndescriptors: []\n")
    b = ("b.yaml", "domain: hk\nkey_hash: ''\ndescriptors: []\n")
    c = ("c.yaml", "domain: hk\ndescriptors: [{key: x, rate_limit: {unit: hour}}]\n")
    config = load_files([a, c], merge_domains=True)
    assert config.domains["hk"].key_hash == "md5"  # c.yaml's nodes count under md5 keys too
    with pytest.raises(ConfigError, match="key_hash '' differs from 'md5'") as err:
        load_files([a, c, b], merge_domains=True)
    assert (err.value.file, err.value.line) == ("b.yaml", 2)


@pytest.fixture
def backend(memory_or_redis):  # the shared memory/Redis store (tests/conftest.py)
    return memory_or_redis


async def test_a_hashed_domain_counts_and_answers_queries_by_descriptor(backend) -> None:
    config = load_files([("hk.yaml", CONFIG)])
    limiter = RateLimiter(lambda: config, backend, Settings(backend_timeout_ms=2000), Metrics())
    user = DescriptorIn((("app", "a1"), ("user", "u" * 500)))
    codes = [(await limiter.should_rate_limit("hk", [user])).overall for _ in range(3)]
    assert codes == [OK, OK, OVER_LIMIT]
    ((limit, outcome),) = (await limiter.query("hk", [user]))[0]
    assert (outcome.used, outcome.ok) == (2, False)
    expected = counter_key("rl:", "hk", user.entries, limit.ident, "md5")
    if isinstance(backend, RedisBackend):
        stored = [k.decode() for k in await backend.client.keys("rl:hk|*")]
        # A plain fixed window counts in its window's key: `<counter key>@<window index>`.
        assert [k for k in stored if k.rsplit("@", 1)[0] == expected], (expected, stored)
        assert all("|#md5:" in k for k in stored), stored  # usage keys too
        assert len(expected) == len("rl:hk|#md5:") + 32 + len("|" + limit.ident)
    else:
        assert expected in backend._data


def test_admin_counters_and_usage_show_descriptors_of_a_hashed_domain(
    rls_factory, redis_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "hk.yaml"
    path.write_text(CONFIG)
    srv = rls_factory(path, env={"RLS_REDIS_URL": redis_url})
    app = uuid.uuid4().hex
    entries = [{"key": "app", "value": app}, {"key": "user", "value": "alice"}]
    body = json.dumps({"domain": "hk", "descriptors": [{"entries": entries}]}).encode()
    for _ in range(2):
        status, _ = http(srv.http_url + "/json", body)
        assert status == 200
    status, raw = http(srv.http_url + "/counters", body)
    assert status == 200, raw
    (result,) = json.loads(raw)["results"]
    assert result["entries"] == entries
    (limit,) = result["limits"]
    assert (limit["key"], limit["used"], limit["over_limit"]) == ("hk.app.user", 2, True)
    query = urllib.parse.urlencode({"domain": "hk", "app": app})
    status, raw = http(f"{srv.http_url}/usage?{query}")
    assert status == 200, raw
    assert json.loads(raw)["calls"] == 2
    status, raw = http(srv.http_url + "/rlconfig?format=json")
    dump = json.loads(raw)
    assert dump["key_hash"] == {"hk": "md5"}
    assert {lim["key"]: lim["window"] for lim in dump["limits"]} == {
        "hk.app.user": "aligned", "hk.sms": "rolling_from_first_hit"
    }
    status, raw = http(srv.http_url + "/rlconfig")
    assert "hk.sms: unit=DAY requests_per_unit=5" in raw.decode()
    assert "window: rolling_from_first_hit" in raw.decode()
