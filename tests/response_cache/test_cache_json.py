"""JSON members of a request body (rls/response_cache/jsonbody.py): the weight rules of `hits_from`,
the key parts of `key_fields`, their config validation, and the servicer's replies."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rls.response_cache.config import ConfigError, parse_cache_config
from rls.response_cache.jsonbody import MAX_WEIGHT, Body, body_weight, canonical, key_members
from rls.response_cache.keys import Headers, request_digest
from rls.services.extproc import REQUEST_BODY_AND_RESPONSE_HEADERS, WEIGHT_KEY, WEIGHT_NAMESPACE

from .helpers import (
    config,
    make_service,
    request_body,
    request_headers,
    response_body,
    response_headers,
    run,
)

LIMIT = 1000


def body(data: bytes, complete: bool = True, limit: int = LIMIT) -> Body:
    return Body(data, complete, limit)


def weight(data: bytes, member: str = "payload", **kw: Any) -> tuple[int, str]:
    return body_weight(body(data, **kw), member)


# ------------------------------------------------------------------ weights


def test_string_member_weighs_its_characters_not_bytes() -> None:
    assert weight('{"payload": "héllo ✓ 😀"}'.encode()) == (9, "member")
    assert weight(b'{"payload": "\\ud83d\\ude00"}') == (1, "member")  # one code point


def test_number_member_is_the_weight() -> None:
    assert weight(b'{"payload": 37}') == (37, "member")
    assert weight(b'{"payload": 5.0}') == (5, "member")
    assert weight(b'{"payload": 1000000000}') == (MAX_WEIGHT, "member")


def test_every_weight_is_at_least_one() -> None:
    assert weight(b'{"payload": ""}') == (1, "member")
    assert weight(b'{"payload": 0}') == (1, "member")
    assert weight(b"") == (1, "not_json")


@pytest.mark.parametrize("value", [
    "null", "true", "false", "[1, 2]", '{"a": 1}', "-1", "2.5", "1000000001", "1e300",
])
def test_other_values_fall_back_to_the_body_size(value: str) -> None:
    data = f'{{"payload": {value}}}'.encode()
    assert weight(data) == (len(data), "bad_type")


@pytest.mark.parametrize(("data", "source"), [
    (b'{"text": "hi"}', "missing"),
    (b'{"Payload": "hi"}', "missing"),  # exact name only
    (b'{"nested": {"payload": "hi"}}', "missing"),  # top level only
    (b"payload=hi", "not_json"),
    (b'["payload", "hi"]', "not_json"),  # not an object
    (b'"payload"', "not_json"),
    (b'{"payload": NaN}', "not_json"),
    (b'{"payload": 1e400}', "not_json"),
    (b'{"payload": "hi"', "not_json"),
    (b'\xff{"payload": "hi"}', "not_json"),
    (b"[" * 100_000, "not_json"),  # deeper than the parser's recursion limit: no crash
])
def test_unusable_bodies_fall_back_to_the_body_size(data: bytes, source: str) -> None:
    assert weight(data, limit=1 << 20) == (len(data), source)


def test_partial_or_oversized_bodies_are_not_parsed() -> None:
    data = json.dumps({"payload": "x" * 10}).encode()
    assert weight(data, complete=False) == (len(data), "partial")
    assert weight(data, limit=len(data) - 1) == (len(data), "too_large")
    assert weight(data, limit=len(data)) == (10, "member")


@given(st.text(max_size=200), st.dictionaries(st.text(max_size=8), st.integers()))
def test_any_string_payload_weighs_its_length(payload: str, others: dict[str, int]) -> None:
    data = json.dumps({**others, "payload": payload}).encode()
    assert weight(data, limit=1 << 20) == (max(1, len(payload)), "member")


@given(st.binary(max_size=300))
def test_any_body_gets_a_weight_and_never_raises(data: bytes) -> None:
    w, source = weight(data)
    assert w in range(1, MAX_WEIGHT + 1)
    if source != "member":
        assert w == max(1, len(data))


# ------------------------------------------------------------------ key parts

NAMES = ("api", "extraKey", "payload")
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=8,
)


def members(doc: Any) -> tuple[bytes | None, ...]:
    parts, failure = key_members(body(json.dumps(doc).encode(), limit=1 << 20), NAMES)
    assert failure is None
    return parts


def test_missing_null_and_empty_are_three_keys() -> None:
    assert members({}) == (None, None, None)
    assert members({"api": None, "extraKey": "", "payload": 0}) == (b"null", b'""', b"0")


def test_member_order_spacing_and_other_members_do_not_matter() -> None:
    a = b'{"api": "en2fr", "payload": {"b": 1, "a": [1, 2]}, "requestId": 7}'
    b = b'{"payload":{"a":[1,2],"b":1},"requestId":8,"api":"en2fr"}'
    assert key_members(body(a), NAMES) == key_members(body(b), NAMES)


@pytest.mark.parametrize(("data", "complete", "reason"), [
    (b"payload=hi", True, "not_json"),
    (b"[]", True, "not_json"),
    (b"{}" + b" " * LIMIT, True, "json_too_large"),
    (b"{}", False, "partial_request_body"),
])
def test_unreadable_bodies_give_a_bypass_reason(data: bytes, complete: bool, reason: str) -> None:
    assert key_members(body(data, complete), NAMES) == ((), reason)


@given(st.dictionaries(st.sampled_from((*NAMES, "other")), JSON),
       st.dictionaries(st.sampled_from((*NAMES, "other")), JSON))
def test_key_parts_are_equal_exactly_when_the_members_are(a: dict[str, Any],
                                                          b: dict[str, Any]) -> None:
    same = all((n in a) == (n in b) and (n not in a or canonical(a[n]) == canonical(b[n]))
               for n in NAMES)
    assert (members(a) == members(b)) is same
    rule = config(FIELDS_RULES).rules[0]
    headers = Headers([(":path", b"/translate")])
    digest_a = request_digest(rule, "POST", headers, b"", members(a))
    assert (digest_a == request_digest(rule, "POST", headers, b"", members(b))) is same


def test_a_member_moved_to_another_name_changes_the_key() -> None:
    assert members({"api": "x"}) != members({"extraKey": "x"})


# ------------------------------------------------------------------ config

FIELDS_RULES = """
coalesce_wait_ms: 0
version_cache_ms: 0
rules:
- api: translate
  methods: [POST]
  key: {extra_key_header: x-cache-key}
  key_fields: [api, extraKey, payload]
  hits_from: json:payload
  max_json_bytes: 1000
  max_entry_bytes: 1000
"""


def test_rule_fields_parse() -> None:
    rule = config(FIELDS_RULES).rules[0]
    assert rule.key.fields == NAMES and not rule.key.body
    assert rule.hits_from == "payload" and rule.max_json_bytes == 1000
    assert rule.needs_body
    plain = config("- {api: a}").rules[0]
    assert plain.hits_from is None and plain.key.fields == () and not plain.needs_body
    assert plain.max_json_bytes == 64 * 1024


@pytest.mark.parametrize(("text", "message"), [
    ("- {api: a, key_fields: []}", "'key_fields' must be a list of 1-32 JSON member names"),
    ("- {api: a, key_fields: payload}", "'key_fields' must be a list"),
    ("- {api: a, key_fields: [a, a]}", "'key_fields': duplicate member 'a'"),
    ("- {api: a, key_fields: [1]}", "'key_fields': a JSON member name"),
    ("- {api: a, key_fields: [''] }", "'key_fields': a JSON member name"),
    ("- {api: a, key: {body: true}, key_fields: [a]}", "drop key 'body: true'"),
    ("- {api: a, hits_from: payload}", "'hits_from' must be json:MEMBER"),
    ("- {api: a, hits_from: 'json:'}", "'hits_from': a JSON member name"),
    ("- {api: a, hits_from: 5}", "'hits_from' must be json:MEMBER"),
    ("- {api: a, max_json_bytes: 0}", "'max_json_bytes' must be a size"),
])
def test_rule_field_errors_say_where(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_cache_config("cache.yaml", text)
    assert str(info.value).startswith("cache.yaml: rules[0] (api a): ")
    assert message in str(info.value)


# ------------------------------------------------------------------ servicer


def sent_weight(reply: Any) -> str | None:
    fields = reply.dynamic_metadata.fields
    if WEIGHT_NAMESPACE not in fields:
        return None
    value: str = fields[WEIGHT_NAMESPACE].struct_value.fields[WEIGHT_KEY].string_value
    return value


async def test_weight_rides_on_the_body_reply_of_a_miss_and_of_a_hit() -> None:
    service, cache = make_service(FIELDS_RULES)
    data = b'{"api": "en2fr", "payload": "hello", "id": 1}'
    ctx = await run(service, [request_headers(), request_body(data),
                              response_headers(length=3), response_body(b"out")])
    ask, at_body, _, _ = ctx.replies()
    assert ask.mode_override == REQUEST_BODY_AND_RESPONSE_HEADERS
    assert sent_weight(ask) is None and sent_weight(at_body) == "5"
    ctx = await run(service, [request_headers(),
                              request_body(b'{"id": 2, "payload": "hello", "api": "en2fr"}')])
    hit = ctx.replies()[1]
    assert hit.immediate_response.body == b"out"
    assert sent_weight(hit) == "5"
    assert cache.metrics.weights.labels("translate", "member")._value.get() == 2


async def test_request_no_store_still_reads_the_body_for_the_weight() -> None:
    service, cache = make_service(FIELDS_RULES)
    ctx = await run(service, [request_headers(headers=[("cache-control", "no-store")]),
                              request_body(b'{"payload": "abc"}'), response_headers(length=1)])
    ask, at_body, _ = ctx.replies()
    assert ask.mode_override == REQUEST_BODY_AND_RESPONSE_HEADERS
    assert sent_weight(at_body) == "3"
    assert cache.metrics.bypasses.labels("request_no_store")._value.get() == 1


async def test_a_request_without_a_body_weighs_one() -> None:
    service, cache = make_service(FIELDS_RULES)
    ctx = await run(service, [request_headers(eos=True), response_headers(length=1)])
    assert sent_weight(ctx.replies()[0]) == "1"
    assert cache.metrics.weights.labels("translate", "not_json")._value.get() == 1
    assert cache.metrics.bypasses.labels("not_json")._value.get() == 1


async def test_not_json_bypasses_key_fields_and_weighs_the_body_bytes() -> None:
    service, cache = make_service(FIELDS_RULES)
    ctx = await run(service, [request_headers(), request_body(b"payload=abc"),
                              response_headers(length=1)])
    at_body = ctx.replies()[1]
    assert sent_weight(at_body) == "11"
    assert cache.metrics.bypasses.labels("not_json")._value.get() == 1
    assert cache.store.data == {}


async def test_rules_without_hits_from_send_no_metadata() -> None:
    service, _cache = make_service()
    ctx = await run(service, [request_headers(headers=[("x-cache-key", "k")]),
                              request_body(b'{"payload": "abc"}'), response_headers(length=1),
                              response_body(b"x")])
    assert all(sent_weight(r) is None for r in ctx.replies())
