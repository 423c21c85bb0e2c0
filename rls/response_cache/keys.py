"""Rule selection and cache keys.

A key is `<prefix>e:<api>:<version>:<digest>`: the API name is the purge namespace, the version
is that API's current generation (purge = new version, O(1)), and the digest is a SHA-256 over
an injective encoding of the key parts, so keys are bounded (< 200 bytes, SSDB-safe) whatever
the body size, and `a|bc` never meets `ab|c`.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rls.response_cache.config import CacheConfig, CacheRule

_LEN = struct.Struct(">I")


class Headers:
    """Request or response headers as Envoy sends them: lower-case names, raw bytes values.

    Repeated names are kept in order; `get` joins them with `,` as HTTP allows.
    """

    __slots__ = ("items",)

    def __init__(self, items: Iterable[tuple[str, bytes]]) -> None:
        self.items = [(k.lower(), v) for k, v in items]

    @classmethod
    def from_proto(cls, header_map: Any) -> Headers:
        """From an `envoy.config.core.v3.HeaderMap`: values come in `raw_value` (`value` empty)."""
        return cls((h.key, h.raw_value or h.value.encode()) for h in header_map.headers)

    def get(self, name: str) -> bytes | None:
        values = [v for k, v in self.items if k == name]
        if not values:
            return None
        return values[0] if len(values) == 1 else b",".join(values)

    def has(self, name: str) -> bool:
        return any(k == name for k, _ in self.items)

    def text(self, name: str) -> str:
        value = self.get(name)
        return "" if value is None else value.decode("latin-1")


def select_rule(
    config: CacheConfig, method: str, attributes: Mapping[str, Any], headers: Headers
) -> tuple[CacheRule | None, str]:
    """The first rule whose API selection matches, or None with the bypass reason.

    A request whose API matches but whose method is not listed is reported as `method`, so an
    operator can tell "not a cached API" from "cached API, uncached method".
    """
    api_matched = False
    for rule in config.rules:
        m = rule.match
        if m.kind == "attribute":
            got = attributes.get(m.name)
            if got is None or str(got) != m.value:
                continue
        else:
            value = headers.get(m.name)
            if value is None or (m.value is not None and value.decode("latin-1") != m.value):
                continue
        api_matched = True
        if method in rule.methods:
            return rule, ""
    return None, "method" if api_matched else "no_rule"


def _part(h: Any, tag: bytes, value: bytes | None) -> None:
    """Tagged, length-prefixed part; an absent value differs from an empty one."""
    if value is None:
        h.update(tag + b"\x00")
    else:
        h.update(tag + b"\x01" + _LEN.pack(len(value)))
        h.update(value)


def request_digest(
    rule: CacheRule, method: str, headers: Headers, body: bytes,
    members: Sequence[bytes | None] = (),
) -> bytes:
    """SHA-256 of the rule's key parts for this request (method always included).

    `members`: with `key_fields`, each listed JSON member's canonical bytes in the listed order,
    None when absent (rls/response_cache/jsonbody.py), each part tagged with its member name.
    """
    h = hashlib.sha256()
    _part(h, b"M", method.encode())
    path = headers.get(":path") or b""
    raw_path, _, query = path.partition(b"?")
    key = rule.key
    if key.path:
        _part(h, b"P", raw_path)
    if key.query:
        _part(h, b"Q", query)
    if key.extra_key_header:
        _part(h, b"X", headers.get(key.extra_key_header))
    for name in key.headers:
        _part(h, b"H" + name.encode(), headers.get(name))
    if key.body:
        _part(h, b"B", body)
    if key.fields:
        if len(members) != len(key.fields):
            raise ValueError("one value (or None) per key_fields member")
        for name, value in zip(key.fields, members, strict=True):
            _part(h, b"F", name.encode())
            _part(h, b"J", value)
    return h.digest()


def vary_digest(base: bytes, names: Iterable[str], headers: Headers) -> bytes:
    """Secondary digest: the base key plus the request's values of the Vary-listed headers."""
    h = hashlib.sha256()
    h.update(base)
    for name in sorted(names):
        _part(h, b"V" + name.encode(), headers.get(name))
    return h.digest()


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def entry_key(prefix: str, api: str, version: str, digest: bytes) -> str:
    return f"{prefix}e:{api}:{version}:{_b64(digest)}"


def version_key(prefix: str, api: str) -> str:
    return f"{prefix}v:{api}"
