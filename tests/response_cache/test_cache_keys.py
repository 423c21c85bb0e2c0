"""Keys (injective, bounded), rule selection, the entry envelope and what is never stored."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rls.response_cache.config import API_ATTRIBUTE
from rls.response_cache.entry import (
    KIND_VARY,
    Entry,
    EntryError,
    never_store_reason,
    storable_headers,
    vary_names,
)
from rls.response_cache.keys import Headers, entry_key, request_digest, select_rule, vary_digest
from rls.response_cache.store import bound_key

from .helpers import config

CONFIG = config()
TRANSLATE = CONFIG.rules[0]
ITEMS = CONFIG.rules[1]


def req(body_key: str | None = "k1", path: str = "/translate", **extra: str) -> Headers:
    items = [(":path", path.encode()), (":method", b"POST")]
    if body_key is not None:
        items.append(("x-cache-key", body_key.encode()))
    items += [(k.replace("_", "-"), v.encode()) for k, v in extra.items()]
    return Headers(items)


def digest(headers: Headers, body: bytes = b"hello", rule=TRANSLATE, method: str = "POST") -> bytes:
    return request_digest(rule, method, headers, body)


def test_same_body_and_extra_key_same_key() -> None:
    assert digest(req()) == digest(req())
    # headers outside the key do not matter
    assert digest(req(user_agent="curl")) == digest(req(user_agent="python"))


def test_any_key_part_changes_the_key() -> None:
    base = digest(req())
    assert digest(req(), b"hello!") != base
    assert digest(req("k2")) != base
    assert digest(req(None)) != base
    assert digest(req("")) != digest(req(None))  # empty extra key is not an absent one
    assert digest(req(path="/translate/v2")) != base
    assert digest(req(), method="PUT") != base


def test_query_only_when_configured() -> None:
    a = Headers([(":path", b"/items?page=1")])
    b = Headers([(":path", b"/items?page=2")])
    assert digest(a, b"", ITEMS, "GET") != digest(b, b"", ITEMS, "GET")
    assert digest(a, b"", TRANSLATE) == digest(b, b"", TRANSLATE)  # path kept, query not


@given(st.binary(max_size=64), st.binary(max_size=64), st.binary(max_size=64),
       st.binary(max_size=64))
def test_parts_are_injective(k1: bytes, b1: bytes, k2: bytes, b2: bytes) -> None:
    h1 = Headers([(":path", b"/t"), ("x-cache-key", k1)])
    h2 = Headers([(":path", b"/t"), ("x-cache-key", k2)])
    same = (k1, b1) == (k2, b2)
    assert (digest(h1, b1) == digest(h2, b2)) == same


def test_keys_are_bounded_and_ssdb_safe() -> None:
    key = entry_key("rc:", "a" * 64, "18c2f0a1b2c3d4", digest(req(), b"x" * 1_000_000))
    assert len(key.encode()) < 200
    assert bound_key(key) == key
    long = "p:" + "k" * 400
    bounded = bound_key(long)
    assert len(bounded.encode()) <= 255 and bounded != bound_key(long + "x")


def test_vary_digest() -> None:
    base = digest(req())
    en = Headers([("accept-language", b"en")])
    de = Headers([("accept-language", b"de")])
    names = frozenset({"accept-language"})
    assert vary_digest(base, names, en) != vary_digest(base, names, de)
    assert vary_digest(base, names, en) == vary_digest(base, names, en)


def test_select_rule() -> None:
    attrs = {API_ATTRIBUTE: "translate"}
    assert select_rule(CONFIG, "POST", attrs, req()) == (TRANSLATE, "")
    assert select_rule(CONFIG, "GET", attrs, req()) == (None, "method")
    assert select_rule(CONFIG, "POST", {API_ATTRIBUTE: "nope"}, req()) == (None, "no_rule")
    assert select_rule(CONFIG, "POST", {}, req()) == (None, "no_rule")


def test_headers_from_envoy() -> None:
    h = Headers([("Link", b"a"), ("link", b"b"), ("x", b"")])
    assert h.get("link") == b"a,b"
    assert h.get("x") == b""
    assert h.get("missing") is None
    assert h.has("x") and not h.has("y")


def test_entry_round_trip() -> None:
    entry = Entry(203, (("content-type", b"a/b"), ("x-bin", b"\x00\xff\r\n")), b"\x00body",
                  1_700_000_000_123)
    assert Entry.decode(entry.encode()) == entry
    pointer = Entry.vary_pointer(frozenset({"accept-language", "accept"}), 5)
    decoded = Entry.decode(pointer.encode())
    assert decoded.kind == KIND_VARY
    assert decoded.vary_names == {"accept", "accept-language"}
    for bad in (b"", b"\x07" + b"\x00" * 12, entry.encode()[:20]):
        with pytest.raises(EntryError):
            Entry.decode(bad)


def test_stripped_before_storing() -> None:
    headers = Headers([
        (":status", b"200"), ("content-type", b"text/plain"), ("content-length", b"5"),
        ("date", b"today"), ("connection", b"keep-alive, x-hop"), ("x-hop", b"1"),
        ("keep-alive", b"timeout=5"), ("transfer-encoding", b"chunked"), ("te", b"trailers"),
        ("trailer", b"x"), ("upgrade", b"h2c"), ("proxy-connection", b"x"),
        ("proxy-authenticate", b"Basic"), ("x-envoy-upstream-service-time", b"4"),
        ("x-envoy-decorator-operation", b"x"), ("x-cache", b"MISS"), ("age", b"3"),
        ("x-ratelimit-limit", b"3"), ("etag", b'"v1"'), ("cache-control", b"max-age=60"),
    ])
    assert storable_headers(headers) == (
        ("content-type", b"text/plain"), ("etag", b'"v1"'), ("cache-control", b"max-age=60"),
    )


@pytest.mark.parametrize(
    ("status", "headers", "reason"),
    [
        (200, [], None),
        (200, [("cache-control", b"public, max-age=600")], None),
        (200, [("vary", b"Accept-Language")], None),  # listed in the rule's vary
        (200, [("content-length", b"1000")], None),
        (200, [("content-length", b"1001")], "too_large"),
        (304, [], "status"),
        (500, [], "status"),
        (200, [("cache-control", b"no-store")], "no_store"),
        (200, [("cache-control", b"Private")], "private"),
        (200, [("cache-control", b'private="set-cookie"')], "private"),
        (200, [("cache-control", b"max-age=0, no-cache")], "no_cache"),
        (200, [("set-cookie", b"a=1")], "set_cookie"),
        (200, [("vary", b"*")], "vary"),
        (200, [("vary", b"accept-language, cookie")], "vary"),
    ],
)
def test_never_store_reason(status: int, headers: list, reason: str | None) -> None:
    assert never_store_reason(ITEMS, status, Headers(headers)) == reason


def test_vary_names() -> None:
    assert vary_names(Headers([])) == set()
    assert vary_names(Headers([("vary", b"A, b"), ("vary", b"C")])) == {"a", "b", "c"}
    assert vary_names(Headers([("vary", b"*")])) is None
