"""The one client of the admin API, shared by the sub-commands that call it (`rls counters`,
`usage`, `switches`, `cache`, `top`).

One style for all of them: `--admin` and `--token` alike (`add_admin_options`); the answer as
JSON on stdout and exit 0 on success (`report`); on failure one line `rls <command>: …` on
stderr and a non-zero exit (1: the admin API said no, with its HTTP status and error; 2: it
could not be reached or the arguments were bad).
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import urllib.error
import urllib.request
from typing import Any

from rls.settings.environment import admin_token, env_value

ADMIN_URL_DEFAULT = "http://127.0.0.1:8080"
TOKEN_HINT = "pass --token or set RLS_ADMIN_TOKEN"


def add_admin_options(parser: argparse.ArgumentParser) -> None:
    """`--admin` and `--token`, the same for every sub-command that calls the admin API."""
    parser.add_argument(
        "--admin",
        "--admin-url",
        dest="admin",
        default=env_value("admin_url") or ADMIN_URL_DEFAULT,
        help=f"admin API base URL (default {ADMIN_URL_DEFAULT}; env RLS_ADMIN_URL)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help="bearer token of the admin API (default: env RLS_ADMIN_TOKEN)",
    )


class HttpFailure(Exception):
    """The admin API answered with a non-2xx status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


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


def report(command: str, admin: str, path: str, body: Any | None, token: str | None,
           method: str | None = None) -> int:
    """One admin call of `rls <command>`, its answer printed; the exit status (see above)."""
    try:
        payload = call(admin, path, body, token, method)
    except HttpFailure as exc:
        print(f"rls {command}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        return fail(command, str(exc))
    print(json.dumps(payload, indent=2))
    return 0


def fail(command: str, message: str) -> int:
    print(f"rls {command}: {message}", file=sys.stderr)
    return 2
