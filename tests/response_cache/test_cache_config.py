"""Cache rules YAML: defaults, accepted forms, and a `file: message` error for every bad value."""

from __future__ import annotations

from pathlib import Path

import pytest

from rls.config.errors import ConfigError
from rls.response_cache import check_cache_file, is_cache_file, load_cache_config
from rls.response_cache.config import (
    API_ATTRIBUTE,
    DEFAULT_MAX_ENTRY,
    DEFAULT_TTL,
    parse_cache_config,
)

ROOT = Path(__file__).resolve().parents[2]


def test_defaults() -> None:
    config = parse_cache_config("f.yaml", "- api: translate\n")
    [rule] = config.rules
    assert rule.methods == {"GET", "POST"}
    assert rule.ttl == DEFAULT_TTL == 7 * 86400
    assert rule.max_entry_bytes == DEFAULT_MAX_ENTRY == 1 << 20
    assert rule.statuses == {200}
    assert rule.vary == frozenset()
    assert not rule.buffer_unknown_length
    assert (rule.match.kind, rule.match.name, rule.match.value) == (
        "attribute", API_ATTRIBUTE, "translate"
    )
    assert (rule.key.path, rule.key.query, rule.key.body) == (True, False, False)
    assert config.key_prefix == "rc:"
    assert config.store_timeout_ms == 50
    assert config.coalesce_wait_ms == 100
    assert config.attributes() == {API_ATTRIBUTE}
    assert config.memory_max_bytes == 64 << 20
    assert (config.writer_workers, config.write_queue_size) == (4, 1000)
    assert (config.write_queue_bytes, config.write_drain_ms) == (64 << 20, 2000)


def test_writer_and_memory_options() -> None:
    config = parse_cache_config("f.yaml", """
memory_max_bytes: 1GiB
writer_workers: 2
write_queue_size: 50
write_queue_bytes: 8MiB
write_drain_ms: 500
rules: []
""")
    assert config.memory_max_bytes == 1 << 30
    assert (config.writer_workers, config.write_queue_size) == (2, 50)
    assert (config.write_queue_bytes, config.write_drain_ms) == (8 << 20, 500)


def test_full_rule() -> None:
    config = parse_cache_config("f.yaml", """
store: ssdb://127.0.0.1:8888
key_prefix: "x:"
store_timeout_ms: 20
rules:
- api: search.v2
  match: {header: X-Cacheable, value: 1}
  methods: [get, HEAD]
  key:
    api: true
    path: false
    extra_key_header: X-Cache-Key
    headers: [Accept-Language, ":authority"]
    query: true
    body: true
  ttl: 12h
  max_entry_bytes: 512KiB
  statuses: [200, 203]
  vary: [Accept-Encoding]
  unknown_length: buffer
- api: other
  match: {attribute: xds.route_name, value: other_route}
  ttl: 90
  max_entry_bytes: 1000
""")
    first, second = config.rules
    assert first.match.kind == "header" and first.match.name == "x-cacheable"
    assert first.match.value == "1"
    assert first.methods == {"GET", "HEAD"}
    assert first.key.extra_key_header == "x-cache-key"
    assert first.key.headers == ("accept-language", ":authority")
    assert not first.key.path and first.key.query and first.key.body
    assert first.ttl == 12 * 3600
    assert first.max_entry_bytes == 512 * 1024
    assert first.statuses == {200, 203}
    assert first.vary == {"accept-encoding"}
    assert first.buffer_unknown_length
    assert second.ttl == 90 and second.max_entry_bytes == 1000
    assert config.attributes() == {"xds.route_name"}
    assert config.store == "ssdb://127.0.0.1:8888"
    assert config.apis == {"search.v2", "other"}


@pytest.mark.parametrize(("unit", "seconds"), [("45s", 45), ("30m", 1800), ("2w", 14 * 86400),
                                                ("7d", 7 * 86400), ("3600", 3600)])
def test_durations(unit: str, seconds: int) -> None:
    assert parse_cache_config("f", f"- {{api: a, ttl: '{unit}'}}\n").rules[0].ttl == seconds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "cache config must be a list of rules or a mapping with 'rules'"),
        ("foo", "cache config must be a list of rules or a mapping with 'rules'"),
        ("rules: {}", "'rules' must be a list"),
        ("store: x\nrules: []", "'store' must be a URL"),
        ("key_prefix: ''\nrules: []", "'key_prefix' must be a non-empty string of at most 32"),
        (f"key_prefix: {'a' * 33}\nrules: []", "'key_prefix' must be a non-empty string"),
        ("api_attribute: ''\nrules: []", "'api_attribute' must be a non-empty CEL expression"),
        ("store_timeout_ms: 0\nrules: []", "'store_timeout_ms' must be an integer from 1"),
        ("coalesce_wait_ms: -1\nrules: []", "'coalesce_wait_ms' must be an integer from 0"),
        ("version_cache_ms: x\nrules: []", "'version_cache_ms' must be an integer"),
        ("memory_max_bytes: 0\nrules: []", "'memory_max_bytes' must be a size from 1 byte to 64G"),
        ("memory_max_bytes: 65GiB\nrules: []", "'memory_max_bytes' must be a size"),
        ("writer_workers: 0\nrules: []", "'writer_workers' must be an integer from 1 to 64"),
        ("write_queue_size: 0\nrules: []", "'write_queue_size' must be an integer from 1"),
        ("write_queue_bytes: lots\nrules: []", "'write_queue_bytes' must be a size"),
        ("write_drain_ms: -1\nrules: []", "'write_drain_ms' must be an integer from 0"),
        ("rulez: []", "cache config: unknown key 'rulez'"),
        ("stores: x\nrules: []", "unknown key 'stores'"),
        ("- 3", "rules[0]: a rule must be a mapping"),
        ("- {ttl: 5}", "rules[0]: 'api' is required"),
        ("- {api: 'has space'}", "rules[0]: 'api' is required"),
        (f"- {{api: {'a' * 65}}}", "rules[0]: 'api' is required"),
        ("- {api: a, tll: 5}", "rules[0]: unknown key 'tll'"),
        ("- {api: a, methods: []}", "rules[0] (api a): 'methods' must be a non-empty list"),
        ("- {api: a, methods: [FETCH]}", "rules[0] (api a): unknown method 'FETCH'"),
        ("- {api: a, methods: GET}", "'methods' must be a non-empty list"),
        ("- {api: a, ttl: 0}", "'ttl' must be a duration from 1s to 10 years"),
        ("- {api: a, ttl: 7 days}", "'ttl' must be a duration"),
        ("- {api: a, ttl: 1.5}", "'ttl' must be a duration"),
        ("- {api: a, ttl: true}", "'ttl' must be a duration"),
        ("- {api: a, ttl: 11000d}", "'ttl' must be a duration from 1s to 10 years"),
        ("- {api: a, max_entry_bytes: 0}", "'max_entry_bytes' must be a size"),
        ("- {api: a, max_entry_bytes: 1GiB}", "'max_entry_bytes' must be a size"),
        ("- {api: a, max_entry_bytes: 65MiB}", "'max_entry_bytes' must be a size"),
        ("- {api: a, statuses: [404]}", "status 404 cannot be cached: only 2xx"),
        ("- {api: a, statuses: [206]}", "status 206 cannot be cached"),
        ("- {api: a, statuses: ['200']}", "status '200' cannot be cached"),
        ("- {api: a, statuses: []}", "'statuses' must be a non-empty list"),
        ("- {api: a, vary: accept}", "'vary' must be a list of header names"),
        ("- {api: a, vary: ['bad header']}", "'bad header' is not a header name"),
        ("- {api: a, vary: [a, A]}", "duplicate header 'a'"),
        ("- {api: a, unknown_length: keep}", "'unknown_length' must be skip (default) or buffer"),
        ("- {api: a, match: yes}", "'match' must be a mapping"),
        ("- {api: a, match: {}}", "'match' needs exactly one of 'header' or 'attribute'"),
        ("- {api: a, match: {header: x, attribute: y, value: z}}", "exactly one of"),
        ("- {api: a, match: {attribute: xds.route_name}}", "match by 'attribute' needs a 'value'"),
        ("- {api: a, match: {header: 'a b'}}", "match 'header' must be a header name"),
        ("- {api: a, match: {header: x, value: [1]}}", "match 'value' must be a string"),
        ("- {api: a, match: {header: x, valeu: 1}}", "match: unknown key 'valeu'"),
        ("- {api: a, key: [body]}", "'key' must be a mapping"),
        ("- {api: a, key: {bodyy: true}}", "key: unknown key 'bodyy'"),
        ("- {api: a, key: {body: 1}}", "key 'body' must be true or false"),
        ("- {api: a, key: {query: 'yes'}}", "key 'query' must be true or false"),
        ("- {api: a, key: {api: false}}", "key 'api' cannot be turned off"),
        ("- {api: a, key: {extra_key_header: 5}}", "key 'extra_key_header' must be a header name"),
        ("- {api: a, key: {headers: x}}", "key 'headers' must be a list of header names"),
        ("rules: [\n", "error loading cache config: yaml:"),
    ],
)
def test_validation_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_cache_config("cache.yaml", text)
    assert str(info.value).startswith("cache.yaml: ")
    assert message in str(info.value)


def test_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {api: a, ttl: never}\n")
    with pytest.raises(ConfigError) as info:
        check_cache_file(str(bad))
    assert str(info.value).startswith(f"{bad}: rules[0] (api a): 'ttl'")
    with pytest.raises(ConfigError, match="cannot read cache config"):
        load_cache_config(str(tmp_path / "missing.yaml"))


def test_shipped_example_is_valid() -> None:
    config = load_cache_config(str(ROOT / "config" / "cache.yaml"))
    translate = next(r for r in config.rules if r.api == "translate")
    assert translate.methods == {"POST"}
    # DESIGN §9.1: keyed on API + client extra key + payload, charged by the payload's length
    assert translate.key.fields == ("api", "extraKey", "payload") and not translate.key.body
    assert translate.hits_from == "payload"
    assert translate.max_json_bytes <= 65536
    assert translate.ttl == 7 * 86400
    # within the buffer filter's 64 KiB stream limit of envoy/gateway-cache.yaml
    assert translate.max_entry_bytes <= 65536
    for path in ROOT.glob("config/cache*.yaml"):
        check_cache_file(str(path))


def test_is_cache_file(tmp_path: Path) -> None:
    assert is_cache_file(str(ROOT / "config" / "cache.yaml"))
    assert not is_cache_file(str(ROOT / "config" / "example.yaml"))  # a descriptor file
    for name, text, expected in [
        ("list.yaml", "- api: a\n", True),
        ("rules.yaml", "rules: []\n", True),
        ("descriptor.yaml", "domain: d\ndescriptors: []\n", False),
        ("broken.yaml", "rules: [\n", False),
        ("empty.yaml", "", False),
    ]:
        path = tmp_path / name
        path.write_text(text)
        assert is_cache_file(str(path)) is expected, name
    assert not is_cache_file(str(tmp_path / "missing.yaml"))
