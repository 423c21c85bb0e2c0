"""A tiny HTTP client and a bounded wait, enough to probe the demo's parts and smoke-test it.

The demo talks plain HTTP/1.1 to Envoy's listener and the admin ports; http.client keeps it
free of extra dependencies.
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Reply:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes


def request(
    port: int, method: str, path: str, headers: dict[str, str] | None = None,
    body: bytes | None = None, timeout: float = 5.0,
) -> Reply:
    """One request to 127.0.0.1:`port` on a fresh connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
    finally:
        conn.close()


def wait_for(
    what: str, predicate: Callable[[], bool], timeout: float,
    alive: Callable[[], bool] = lambda: True, log: Callable[[], str] = lambda: "",
) -> None:
    """Poll until `predicate()`; fail at once when `alive()` turns false."""
    deadline = time.monotonic() + timeout
    while True:
        if not alive():
            raise RuntimeError(f"{what}: the process exited\n{log()}")
        try:
            if predicate():
                return
        except (OSError, http.client.HTTPException):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}\n{log()}")
        time.sleep(0.05)
