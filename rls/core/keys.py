"""Counter keys: injective, bounded in length, and readable when short.

Layout: `<prefix><domain>|<k1>|<v1>|…|<kn>|<vn>|<limit ident>`. Inside each component `%`, `|`,
`#`, `{` and `}` are percent-escaped, so the `|` separators are unambiguous (`key=a_b,value=c`
and `key=a,value=b_c` never meet), and no user text can form a Redis Cluster hash tag. A key
longer than MAX_PLAIN bytes becomes `<prefix><first 40 bytes of domain>|#<blake2b-128>|<ident>`;
`|#` cannot occur in a plain key because `#` is escaped, so plain and hashed keys never meet.
The window is not part of the key: fixed-window counters expire at their window's end.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Sequence

MAX_PLAIN = 200
DOMAIN_HEAD = 40  # bytes of the domain kept readable in a hashed key
_SPECIAL = re.compile(r"[%|#{}]")
_ESCAPES = {"%": "%25", "|": "%7C", "#": "%23", "{": "%7B", "}": "%7D"}


def escape(text: str) -> str:
    if _SPECIAL.search(text) is None:
        return text
    return _SPECIAL.sub(lambda m: _ESCAPES[m.group()], text)


def counter_key(prefix: str, domain: str, parts: Sequence[tuple[str, str]], ident: str) -> str:
    body = "|".join([escape(domain), *(f"{escape(k)}|{escape(v)}" for k, v in parts)])
    key = f"{prefix}{body}|{ident}"
    if len(key) <= MAX_PLAIN and (key.isascii() or len(key.encode()) <= MAX_PLAIN):
        return key
    raw = key.encode()
    digest = hashlib.blake2b(raw, digest_size=16).digest()
    tag = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    head = escape(domain).encode()[:DOMAIN_HEAD].decode("utf-8", "ignore")
    return f"{prefix}{head}|#{tag}|{ident}"
