"""Stored entries: a compact binary envelope, and the rules for what may be stored.

Binary rather than JSON because bodies are arbitrary bytes (JSON would need base64, +33 %) and
decoding must be cheap on the hit path. Layout (big endian):

    kind u8 | stored_at_ms u64 | status u16 | n u16
    | n times (name_len u8, value_len u32, name, value) | body

`kind` 1 is a response; kind 2 is a Vary pointer whose header names say which request headers
select the real entry (its values are empty, its body is empty).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from rls.response_cache.config import CacheRule
from rls.response_cache.keys import Headers

KIND_RESPONSE = 1
KIND_VARY = 2
_HEAD = struct.Struct(">BQHH")
_HDR = struct.Struct(">BI")

# Never stored: connection-level (hop-by-hop, RFC 9110 §7.6.1), recomputed by Envoy on a hit
# (content-length, date), set by the cache itself (x-cache, age), and `x-envoy-*`, which Envoy's
# default mutation rules reject even in an ImmediateResponse (it would be dropped silently and
# counted as a rejected mutation). x-ratelimit-* describe the caller who filled the entry.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}
)
NOT_STORED = HOP_BY_HOP | {"content-length", "date", "x-cache", "age"}
NOT_STORED_PREFIXES = ("x-envoy-", "proxy-", "x-ratelimit-", ":")


class EntryError(ValueError):
    """A stored value that is not a valid entry (corrupt, or written by something else)."""


@dataclass(frozen=True, slots=True)
class Entry:
    status: int
    headers: tuple[tuple[str, bytes], ...]
    body: bytes
    stored_at_ms: int
    kind: int = KIND_RESPONSE

    def encode(self) -> bytes:
        parts = [_HEAD.pack(self.kind, self.stored_at_ms, self.status, len(self.headers))]
        for name, value in self.headers:
            raw = name.encode()
            parts.append(_HDR.pack(len(raw), len(value)))
            parts.append(raw)
            parts.append(value)
        parts.append(self.body)
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes) -> Entry:
        try:
            kind, stored_at, status, n = _HEAD.unpack_from(data, 0)
            if kind not in (KIND_RESPONSE, KIND_VARY):
                raise EntryError(f"unknown entry kind {kind}")
            pos = _HEAD.size
            headers = []
            for _ in range(n):
                name_len, value_len = _HDR.unpack_from(data, pos)
                pos += _HDR.size
                name = data[pos : pos + name_len].decode()
                pos += name_len
                value = data[pos : pos + value_len]
                if len(value) != value_len:
                    raise EntryError("truncated header")
                pos += value_len
                headers.append((name, value))
        except (struct.error, UnicodeDecodeError) as exc:
            raise EntryError(f"corrupt entry: {exc}") from None
        return cls(status, tuple(headers), data[pos:], stored_at, kind)

    @classmethod
    def vary_pointer(cls, names: frozenset[str], now_ms: int) -> Entry:
        return cls(0, tuple((n, b"") for n in sorted(names)), b"", now_ms, KIND_VARY)

    @property
    def vary_names(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.headers)


def storable_headers(headers: Headers) -> tuple[tuple[str, bytes], ...]:
    """Response headers worth replaying on a hit (see NOT_STORED)."""
    listed = headers.get("connection") or b""
    per_connection = {t.strip().lower().decode("latin-1") for t in listed.split(b",")}
    return tuple(
        (name, value)
        for name, value in headers.items
        if name not in NOT_STORED
        and not name.startswith(NOT_STORED_PREFIXES)
        and name not in per_connection
    )


def cache_control(headers: Headers) -> set[str]:
    """Directive names of Cache-Control (`private="x"` counts as `private`)."""
    value = headers.get("cache-control")
    if not value:
        return set()
    names = (d.split(b"=", 1)[0].strip().lower() for d in value.split(b","))
    return {n.decode("latin-1") for n in names if n}


def vary_names(headers: Headers) -> set[str] | None:
    """Header names in the response's Vary; None for `Vary: *` (never storable)."""
    value = headers.get("vary")
    if not value:
        return set()
    names = {t.strip().lower().decode("latin-1") for t in value.split(b",") if t.strip()}
    return None if "*" in names else names


def never_store_reason(rule: CacheRule, status: int, headers: Headers) -> str | None:
    """Why a response must not be stored, judged from its headers; None when it may be.

    `no-cache` is refused too: it allows storing only with revalidation before every reuse,
    which this cache never does.
    """
    if status not in rule.statuses:
        return "status"
    directives = cache_control(headers)
    if "no-store" in directives:
        return "no_store"
    if "private" in directives:
        return "private"
    if "no-cache" in directives:
        return "no_cache"
    if headers.has("set-cookie"):
        return "set_cookie"
    names = vary_names(headers)
    if names is None or not names <= rule.vary:
        return "vary"
    length = content_length(headers)
    if length is not None and length > rule.max_entry_bytes:
        return "too_large"
    return None


# Bounds of the envelope (u8 name length, u16 header count) and of a sane Content-Length.
MAX_NAME_BYTES = 255
MAX_HEADERS = 65535
MAX_LENGTH_DIGITS = 19


def status_code(headers: Headers) -> int | None:
    """`:status` when it is three ASCII digits (RFC 9110 §15), else None."""
    raw = headers.get(":status")
    if raw is None or len(raw) != 3 or not raw.isdigit():  # bytes.isdigit: ASCII only
        return None
    return int(raw)


def content_length(headers: Headers) -> int | None:
    """Content-Length when present and 1 to 19 ASCII digits, else None (see header_problem)."""
    raw = headers.get("content-length")
    if raw is None:
        return None
    text = raw.strip()
    if not 0 < len(text) <= MAX_LENGTH_DIGITS or not text.isdigit():
        return None
    return int(text)


def header_problem(headers: Headers) -> str | None:
    """What makes these response headers impossible to judge or to store, or None.

    Envoy never sends such headers, but anyone who can open an ext_proc stream can (a
    5,000-digit `:status` once ended the stream with a traceback, through int()). The caller
    treats them as not cacheable (`malformed_header`) and lets the response pass unchanged.
    """
    if status_code(headers) is None:
        return f":status {_shown(headers.get(':status'))} is not three digits"
    if headers.has("content-length") and content_length(headers) is None:
        return f"content-length {_shown(headers.get('content-length'))} is not a length"
    if len(headers.items) > MAX_HEADERS:
        return f"{len(headers.items)} headers (at most {MAX_HEADERS} can be stored)"
    for name, _ in headers.items:
        if len(name.encode()) > MAX_NAME_BYTES:
            return f"a header name of {len(name.encode())} bytes (at most {MAX_NAME_BYTES})"
    return None


def _shown(value: bytes | None) -> str:
    """A header value for a log line: at most 20 bytes, escaped."""
    if value is None:
        return "(absent)"
    return repr(value[:20]) + ("…" if len(value) > 20 else "")
