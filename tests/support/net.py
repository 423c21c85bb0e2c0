"""Ports for the servers the tests start (always free ones, never a fixed port), and one HTTP
call that answers every status with its body (JSON decoded when it is JSON)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any


def free_port() -> int:
    """A loopback port nobody listens on right now (the kernel picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def connectable(port: int, host: str = "127.0.0.1") -> bool:
    """Something accepts TCP connections on host:port."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def http_call(url: str, method: str, path: str, body: bytes | None = None,
              headers: dict[str, str] | None = None, timeout: float = 10.0) -> tuple[int, Any]:
    """(status, body): JSON decoded, else text; an error status is an answer, not a raise."""
    req = urllib.request.Request(url + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")
