"""Thin clients of the admin API for the CLI (`rls counters`, `usage`, `switches`, `cache purge`).

One style for all of them: the answer as JSON on stdout and exit 0 on success; on failure one
line `rls <command>: …` on stderr and a non-zero exit (1: the admin API said no, with its HTTP
status and error; 2: it could not be reached or the arguments were bad).
"""

from __future__ import annotations

import http.client
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from rls.settings import admin_token

TOKEN_HINT = "pass --token or set RLS_ADMIN_TOKEN"


class HttpFailure(Exception):
    """The admin API answered with a non-2xx status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def parse_descriptor(text: str) -> dict[str, Any]:
    """`app=42,user=alice` -> {"entries": [{"key": "app", "value": "42"}, ...]}.

    A value may contain commas: escaped (`path=/a\\,b`), or simply followed by text with no
    `=` (`tags=a,b,app=1` -> tags="a,b", app="1").
    """
    entries: list[dict[str, str]] = []
    for part in re.split(r"(?<!\\),", text):
        part = part.replace("\\,", ",")
        key, sep, value = part.partition("=")
        if not sep and entries:
            entries[-1]["value"] += "," + part
            continue
        if not key or not sep:
            raise ValueError(f"descriptor entries are key=value, got {part!r}")
        entries.append({"key": key, "value": value})
    return {"entries": entries}


def call(
    admin: str, path: str, body: Any | None = None, token: str | None = None,
    method: str | None = None,
) -> Any:
    """JSON answer of one admin call; raises HttpFailure on non-2xx, OSError if unreachable."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(admin.rstrip("/") + path, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    token = token or admin_token()
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            raw = resp.read()
        try:
            return json.loads(raw or b"null")
        except ValueError:  # some other HTTP server (a proxy's page, another service's port)
            raise OSError(f"{admin} answers {path} with something other than JSON: it is not "
                          "rls's admin API (that listens on --http-addr)") from None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            payload = json.loads(raw)
            message = (
                _error_text(payload, raw.decode())
                if isinstance(payload, dict)
                else raw.decode(errors="replace")
            )
        except ValueError:
            message = raw.decode(errors="replace").strip() or exc.reason
        if exc.code == 401:
            message = f"{message} ({TOKEN_HINT})"
        raise HttpFailure(exc.code, str(message)) from None
    except urllib.error.URLError as exc:
        raise OSError(f"cannot reach {admin}: {exc.reason}") from None
    except http.client.HTTPException:
        # A gRPC port answers HTTP/2 frames: the usual mix-up of 8081 with the admin's 8080.
        raise OSError(f"{admin} does not answer HTTP/1.1 as the admin API does (is it the gRPC "
                      "port? the admin API listens on --http-addr)") from None


def _error_text(payload: dict[str, Any], raw: str) -> str:
    """An error answer's `error`, and what else the server sent with it (`apis: items,
    translate` for an unknown API; a batch's `errors`), so the CLI shows all of it."""
    text = str(payload.get("error", raw))
    for key, value in payload.items():
        if key == "error":
            continue
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            shown = ", ".join(value) or "(none)"
        else:
            shown = json.dumps(value)
        text += f" ({key}: {shown})"
    return text


def run(command: str, admin: str, path: str, body: Any | None, token: str | None,
         method: str | None = None) -> int:
    try:
        payload = call(admin, path, body, token, method)
    except HttpFailure as exc:
        print(f"rls {command}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        return fail(command, str(exc))
    print(json.dumps(payload, indent=2))
    return 0


def counters(admin: str, domain: str, descriptors: Sequence[str], token: str | None = None) -> int:
    body = {"domain": domain, "descriptors": [parse_descriptor(d) for d in descriptors]}
    return run("counters", admin, "/counters", body, token)


def add(
    admin: str, domain: str, descriptors: Sequence[str], hits: int, token: str | None = None
) -> int:
    item: dict[str, Any] = {
        "domain": domain,
        "descriptors": [parse_descriptor(d) for d in descriptors],
    }
    if hits:
        item["hitsAddend"] = hits
    return run("counters", admin, "/add", {"items": [item]}, token)


def usage(
    admin: str, domain: str, values: Sequence[str], day: str | None, distinct: str | None,
    token: str | None = None,
) -> int:
    query: dict[str, str] = {"domain": domain}
    if day:
        query["day"] = day
    if distinct:
        query["distinct"] = distinct
    for item in values:
        key, sep, value = item.partition("=")
        if not key or not sep:
            raise ValueError(f"statistic keys are key=value, got {item!r}")
        query[key] = value
    return run("usage", admin, "/usage?" + urllib.parse.urlencode(query), None, token)


def switches(admin: str, changes: dict[str, Any], token: str | None = None) -> int:
    return run("switches", admin, "/switches", changes or None, token)


def fail(command: str, message: str) -> int:
    print(f"rls {command}: {message}", file=sys.stderr)
    return 2
