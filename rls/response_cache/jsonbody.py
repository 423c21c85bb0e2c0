"""JSON members of a request body: the weight of `hits_from: json:NAME` and the key parts of
`key_fields: [...]` (docs/cache.md, "JSON members").

The rules are defined here once, for the servicer and the tests:

- The body must be one JSON object (UTF-8, RFC 8259; `NaN`, `Infinity`, numbers beyond a
  double and integers over 4300 digits refused), whole
  (`end_of_stream`), and at most the rule's `max_json_bytes`; otherwise it is `partial`,
  `too_large` or `not_json`. Members are looked up at the top level only, by exact name.
- Weight: a string member weighs its length in Unicode code points; a number member its value
  when that is an integer from 0 to `MAX_WEIGHT` (`5.0` counts as 5); anything else (missing,
  null, bool, array, object, a negative, fractional or huge number) falls back. The fallback is
  the body's size in bytes, so a client cannot make a request cheaper by sending something
  that is not the member. Every weight is at least 1: no request is free.
- Key parts: each listed member's canonical JSON (sorted object keys, no spaces, ASCII with
  \\uXXXX escapes), or None when it is absent, so a missing member, `null` and `""` give three
  different keys.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAX_WEIGHT = 1_000_000_000  # Envoy's own bound on a hits_addend number

# How a weight was found: the member, or why the body size was used instead.
WEIGHT_SOURCES = ("member", "missing", "bad_type", "not_json", "too_large", "partial")
# Why a key_fields rule could not read the members (x-cache: BYPASS reasons).
KEY_FAILURES = {"not_json": "not_json", "too_large": "json_too_large",
                "partial": "partial_request_body"}


class NotJson(ValueError):
    """The body is not one JSON object (the reason is `not_json`)."""


def _refuse_constant(name: str) -> Any:
    raise NotJson(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: valid JSON syntax, no JSON value to encode back
        raise NotJson(f"{text} is out of range")
    return value


def parse_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or NotJson."""
    try:
        doc = json.loads(body.decode("utf-8"), parse_constant=_refuse_constant,
                         parse_float=_finite)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        # ValueError: JSONDecodeError, or an integer over Python's digit limit; RecursionError:
        # nesting deeper than the interpreter's recursion limit (the parser checks it)
        raise NotJson(str(exc)) from None
    if not isinstance(doc, dict):
        raise NotJson("not a JSON object")
    return doc


@dataclass(frozen=True, slots=True)
class Body:
    """One request body as the servicer got it, parsed at most once."""

    data: bytes
    complete: bool
    max_bytes: int

    def problem(self) -> str | None:
        """`partial`, `too_large` or None (JSON validity is found by `document`)."""
        if not self.complete:
            return "partial"
        if len(self.data) > self.max_bytes:
            return "too_large"
        return None


def weight_of(value: Any) -> int | None:
    """The weight a member's value gives, or None when it cannot give one (see module doc)."""
    if isinstance(value, str):
        return max(1, len(value))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    number = int(value)
    if not 0 <= number <= MAX_WEIGHT:
        return None
    return max(1, number)


def fallback_weight(body: bytes) -> int:
    return min(MAX_WEIGHT, max(1, len(body)))


def body_weight(body: Body, member: str) -> tuple[int, str]:
    """(weight, source) for `hits_from: json:<member>`; source is one of WEIGHT_SOURCES."""
    problem = body.problem()
    if problem is not None:
        return fallback_weight(body.data), problem
    try:
        doc = parse_object(body.data)
    except NotJson:
        return fallback_weight(body.data), "not_json"
    if member not in doc:
        return fallback_weight(body.data), "missing"
    weight = weight_of(doc[member])
    if weight is None:
        return fallback_weight(body.data), "bad_type"
    return weight, "member"


def canonical(value: Any) -> bytes:
    """One encoding per JSON value: equal values (as parsed) give equal bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode()


def key_members(body: Body, names: Sequence[str]) -> tuple[tuple[bytes | None, ...], str | None]:
    """The canonical value of each listed member (None when absent), or () and the BYPASS
    reason (`KEY_FAILURES`) when the body cannot be read as a JSON object."""
    problem = body.problem()
    if problem is not None:
        return (), KEY_FAILURES[problem]
    try:
        doc = parse_object(body.data)
    except NotJson:
        return (), KEY_FAILURES["not_json"]
    return tuple(canonical(doc[n]) if n in doc else None for n in names), None
