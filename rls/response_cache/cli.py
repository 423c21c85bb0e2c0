"""`rls cache purge --api NAME` and `rls cache stats`: thin clients of the admin API
(POST /cache/purge, GET /cache/stats), with the CLI's usual exit codes and error lines
(rls.admin.client.run: 0 done, 1 refused, 2 unreachable)."""

from __future__ import annotations

import urllib.parse

from rls.admin.client import run


def purge(admin_url: str, api: str, token: str | None) -> int:
    """Purge one API's entries; an unknown API's refusal lists the APIs the server has."""
    path = "/cache/purge?" + urllib.parse.urlencode({"api": api})
    return run("cache purge", admin_url, path, {}, token, method="POST")


def stats(admin_url: str, token: str | None) -> int:
    """The cache's counters per API (GET /cache/stats), as JSON on stdout."""
    return run("cache stats", admin_url, "/cache/stats", None, token)
