"""JSON members through a real Envoy 1.40 (envoy/gateway-cache.yaml, ports rewritten): the
weight of `hits_from: json:payload` reaches the stage-1 ratelimit filter as
`%DYNAMIC_METADATA(rls:hits)%`, and `key_fields` keys the cache on the listed members only.

The stack's RateLimitService is a recording stub (tests/response_cache/harness.py): what it
received is exactly what Envoy sent, hits_addend included. Rules:
tests/response_cache/conftest.py (`translate` keys on the whole body; `translate_fields`,
chosen by the x-key-fields header, on members).
"""

from __future__ import annotations

import json

from .conftest import Stack
from .harness import Response

FIELDS = {"x-key-fields": "1"}


def post(stack: Stack, body: bytes, headers: dict[str, str] | None = None) -> Response:
    return stack.call("POST", "/translate", {"content-type": "application/json",
                                             **(headers or {})}, body)


def doc(**members: object) -> bytes:
    return json.dumps(members).encode()


def weighted(stack: Stack, start: int) -> list[int]:
    """hits_addend of every (api=translate, user) descriptor Envoy sent since `start`."""
    out = []
    for req in stack.server.rate_limit_requests[start:]:
        for d in req.descriptors:
            entries = [(e.key, e.value) for e in d.entries]
            if entries[:1] == [("api", "translate")]:
                assert d.HasField("hits_addend"), req
                out.append(d.hits_addend.value)
    return out


def stage0(stack: Stack, start: int) -> int:
    """RLS calls of the stage-0 filter (the per-address descriptor) since `start`."""
    return sum(1 for req in stack.server.rate_limit_requests[start:]
               for d in req.descriptors if d.entries[0].key == "remote_address")


def test_payload_length_in_characters_is_the_hits_addend(stack: Stack) -> None:
    start = len(stack.server.rate_limit_requests)
    payload = "héllo wörld ✓ " * 30  # 420 characters, more bytes in UTF-8
    body = doc(payload=payload, to="fr")
    assert len(payload) == 420 < len(body)
    first = post(stack, body)
    assert first.status == 200 and first.headers["x-cache"] == "MISS", stack.logs()
    assert weighted(stack, start) == [420]
    assert stack.metric("rls_cache_weights_total", api="translate", source="member") == 1


def test_a_cache_hit_is_not_charged_by_weight_but_counts_per_address(stack: Stack) -> None:
    body = doc(payload="x" * 50)
    assert post(stack, body).headers["x-cache"] == "MISS"
    stack.wait_stored("translate")
    start = len(stack.server.rate_limit_requests)
    hit = post(stack, body)
    assert hit.headers["x-cache"] == "HIT"
    assert weighted(stack, start) == []  # answered before the stage-1 ratelimit filter
    assert stage0(stack, start) == 1  # the stage-0 filter runs before the cache
    assert stack.backend.calls == 1


def test_numeric_member_is_the_weight(stack: Stack) -> None:
    start = len(stack.server.rate_limit_requests)
    assert post(stack, doc(payload=37)).status == 200
    assert weighted(stack, start) == [37]


def test_missing_member_or_non_json_body_is_charged_by_body_bytes(stack: Stack) -> None:
    start = len(stack.server.rate_limit_requests)
    missing = doc(text="no payload member here")
    plain = b"plain text, not JSON " * 10
    assert post(stack, missing).status == 200
    assert post(stack, plain, {"content-type": "text/plain"}).status == 200
    assert weighted(stack, start) == [len(missing), len(plain)]
    assert stack.metric("rls_cache_weights_total", api="translate", source="missing") >= 1
    assert stack.metric("rls_cache_weights_total", api="translate", source="not_json") >= 1


def test_a_bypassed_request_is_still_weighted(stack: Stack) -> None:
    start = len(stack.server.rate_limit_requests)
    r = post(stack, doc(payload="abc"), {"cache-control": "no-store"})
    assert r.headers["x-cache"] == "BYPASS"
    assert weighted(stack, start) == [3]


def test_key_fields_ignore_other_members(stack: Stack) -> None:
    base = {"api": "en2fr", "extraKey": "tenant-7", "payload": "hello"}
    first = post(stack, doc(**base, requestId="r1"), FIELDS)
    assert first.headers["x-cache"] == "MISS", stack.logs()
    stack.wait_stored("translate_fields")
    again = post(stack, doc(requestId="r2", **base), FIELDS)  # other order, other requestId
    assert again.headers["x-cache"] == "HIT"
    assert again.body == first.body
    assert stack.backend.calls == 1

    assert post(stack, doc(**{**base, "payload": "hello!"}), FIELDS).headers["x-cache"] == "MISS"
    assert post(stack, doc(**{**base, "extraKey": None}), FIELDS).headers["x-cache"] == "MISS"
    no_extra = {k: v for k, v in base.items() if k != "extraKey"}
    assert post(stack, doc(**no_extra), FIELDS).headers["x-cache"] == "MISS"
    assert post(stack, doc(**{**base, "extraKey": ""}), FIELDS).headers["x-cache"] == "MISS"
    assert stack.backend.calls == 5


def test_key_fields_with_a_non_json_body_bypass_the_cache(stack: Stack) -> None:
    start = len(stack.server.rate_limit_requests)
    before = stack.metric("rls_cache_bypasses_total", reason="not_json")
    body = b"payload=hello"
    for _ in range(2):
        r = post(stack, body, {**FIELDS, "content-type": "application/x-www-form-urlencoded"})
        assert r.status == 200 and r.headers["x-cache"] == "BYPASS"
    assert stack.backend.calls == 2
    assert stack.metric("rls_cache_bypasses_total", reason="not_json") == before + 2
    assert weighted(stack, start) == [len(body)] * 2


def test_routes_without_a_weighted_descriptor_make_no_stage1_call(stack: Stack) -> None:
    start = len(stack.server.rate_limit_requests)
    r = stack.call("GET", "/items?page=json-e2e")
    assert r.status == 200
    # Both filters call before the request goes upstream, so both calls are in by now.
    calls = stack.server.rate_limit_requests[start:]
    assert len(calls) == 1, calls  # stage 0 only: the stage-1 filter has nothing for /items
    assert [e.key for e in calls[0].descriptors[0].entries] == ["user", "path"]
