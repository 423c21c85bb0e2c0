"""Thin clients of the admin API for the CLI (`rls counters`, `rls usage`, `rls switches`)."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any


def parse_descriptor(text: str) -> dict[str, Any]:
    """`app=42,user=alice` -> {"entries": [{"key": "app", "value": "42"}, ...]}."""
    entries = []
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not key or not sep:
            raise ValueError(f"descriptor entries are key=value, got {part!r}")
        entries.append({"key": key, "value": value})
    return {"entries": entries}


def call(
    admin: str, path: str, body: Any | None = None, token: str | None = None
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(admin.rstrip("/") + path, data=data)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    token = token or os.environ.get("RLS_ADMIN_TOKEN")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, {"error": raw.decode(errors="replace")}


def _print(status: int, payload: Any) -> int:
    print(json.dumps(payload, indent=2))
    return 0 if 200 <= status < 300 else 1


def counters(admin: str, domain: str, descriptors: Sequence[str]) -> int:
    body = {"domain": domain, "descriptors": [parse_descriptor(d) for d in descriptors]}
    return _print(*call(admin, "/counters", body))


def add(admin: str, domain: str, descriptors: Sequence[str], hits: int) -> int:
    item: dict[str, Any] = {
        "domain": domain,
        "descriptors": [parse_descriptor(d) for d in descriptors],
    }
    if hits:
        item["hitsAddend"] = hits
    return _print(*call(admin, "/add", {"items": [item]}))


def usage(
    admin: str, domain: str, values: Sequence[str], day: str | None, distinct: str | None
) -> int:
    query: dict[str, str] = {"domain": domain}
    if day:
        query["day"] = day
    if distinct:
        query["distinct"] = distinct
    for item in values:
        key, _, value = item.partition("=")
        query[key] = value
    return _print(*call(admin, "/usage?" + urllib.parse.urlencode(query)))


def switches(admin: str, changes: dict[str, Any]) -> int:
    if not changes:
        return _print(*call(admin, "/switches"))
    return _print(*call(admin, "/switches", changes))


def fail(message: str) -> int:
    print(f"rls: {message}", file=sys.stderr)
    return 2
