"""Counter keys: injective, bounded in length, and readable when short.

Layout: `<prefix><domain>|<k1>|<v1>|…|<kn>|<vn>|<limit ident>`. Inside each component `%`, `|`,
`#`, `{` and `}` are percent-escaped, so the `|` separators are unambiguous (`key=a_b,value=c`
and `key=a,value=b_c` never meet), and no user text can form a Redis Cluster hash tag. A key
longer than MAX_PLAIN bytes becomes `<prefix><first 40 bytes of domain>|#<blake2b-128>|<ident>`;
`|#` cannot occur in a plain key because `#` is escaped, so plain and hashed keys never meet.
The window is not part of these keys; Redis stores a plain fixed window under `<key>@<window
index>` (rls/stores/windows.py; at most 11 more bytes, still within 250).

A domain with `key_hash: md5|xxh3` (and the counters service's `key_hash`) digests the
descriptor part instead: `<prefix><domain>|#md5:<32 hex>|<ident>` (`#xxh3:` likewise), a fixed
length whatever the values. The digest covers the escaped `<k1>|<v1>|…` text, which is
injective, and 128 bits make collisions negligible; the `:` keeps these keys apart from the
long-key form (base64url has no `:`), `|#` from plain keys. No `{`/`}`: no Cluster hash tag.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable, Sequence

MAX_PLAIN = 200
LONG_VALUE_MARK = "...#"  # joins a long request value's head and its digest
_LONG_VALUE_DIGEST_CHARS = 32  # blake2b-128, hex
DOMAIN_HEAD = 40  # bytes of the domain kept readable in a hashed key
_SPECIAL = re.compile(r"[%|#{}]")
_ESCAPES = {"%": "%25", "|": "%7C", "#": "%23", "{": "%7B", "}": "%7D"}


try:  # optional: xxh3 digests need the xxhash package; md5 is always there
    import xxhash

    _xxh3: Callable[[bytes], str] | None = xxhash.xxh3_128_hexdigest
except ImportError:  # pragma: no cover - depends on the environment
    _xxh3 = None

KEY_HASHES: tuple[str, ...] = ("md5", "xxh3")  # `key_hash:` values ("" or absent: off)


def key_hash_problem(name: str) -> str | None:
    """Why `key_hash: <name>` cannot be used here, or None when it can (config checks)."""
    if name not in KEY_HASHES:
        return f"key_hash must be one of {', '.join(KEY_HASHES)}, not '{name}'"
    if name == "xxh3" and _xxh3 is None:
        return "key_hash xxh3 needs the xxhash package (pip install xxhash); md5 needs nothing"
    return None


def digest(name: str, text: str) -> str:
    """The 32-hex-digit digest of `text` with a KEY_HASHES algorithm (128 bits either way)."""
    data = text.encode("utf-8", "surrogatepass")
    if name == "md5":
        return hashlib.md5(data, usedforsecurity=False).hexdigest()
    if name == "xxh3" and _xxh3 is not None:
        return _xxh3(data)
    raise ValueError(key_hash_problem(name) or f"unknown key_hash {name!r}")


def escape(text: str) -> str:
    if _SPECIAL.search(text) is None:
        return text
    return _SPECIAL.sub(lambda m: _ESCAPES[m.group()], text)


def counter_key(
    prefix: str,
    domain: str,
    parts: Sequence[tuple[str, str]],
    ident: str,
    key_hash: str = "",
) -> str:
    """The key of one counter; `key_hash` ("", "md5", "xxh3"): the domain's `key_hash:`."""
    if key_hash:
        text = "|".join(f"{escape(k)}|{escape(v)}" for k, v in parts)
        return f"{prefix}{escape(domain)}|#{key_hash}:{digest(key_hash, text)}|{ident}"
    body = "|".join([escape(domain), *(f"{escape(k)}|{escape(v)}" for k, v in parts)])
    key = f"{prefix}{body}|{ident}"
    if len(key) <= MAX_PLAIN and (key.isascii() or len(key.encode()) <= MAX_PLAIN):
        return key
    raw = key.encode()
    long_digest = hashlib.blake2b(raw, digest_size=16).digest()
    tag = base64.urlsafe_b64encode(long_digest).rstrip(b"=").decode()
    head = escape(domain).encode()[:DOMAIN_HEAD].decode("utf-8", "ignore")
    return f"{prefix}{head}|#{tag}|{ident}"


def long_value_stand_in(value: str, max_chars: int) -> str:
    """A request value longer than --max-value-bytes, as rls matches and counts it: its head
    (so prefix wildcards under that length still match), then a 128-bit digest of the whole
    (so distinct long values keep distinct counters and equal ones share one).

    Rejecting such a value would make Envoy, which by default lets a request through when the
    rate-limit call fails, pass it unlimited: padding a `:path` would bypass a per-path limit.
    The stand-in bounds what a call costs (matching, metrics labels, keys) all the same."""
    head = max(max_chars - len(LONG_VALUE_MARK) - _LONG_VALUE_DIGEST_CHARS, 0)
    digest = hashlib.blake2b(value.encode(errors="surrogatepass"), digest_size=16).hexdigest()
    return f"{value[:head]}{LONG_VALUE_MARK}{digest}"
