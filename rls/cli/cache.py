"""`rls cache purge --api NAME` and `rls cache stats`: thin clients of the admin API
(POST /cache/purge, GET /cache/stats), with the CLI's usual exit codes and error lines
(rls.admin.client.run: 0 done, 1 refused, 2 unreachable)."""

from __future__ import annotations

import argparse
import urllib.parse
from collections.abc import Callable
from typing import Any

from rls.admin.client import run


def add_parser(sub: Any, admin_options: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register `rls cache purge` and `rls cache stats` on the CLI's subparsers
    (`admin_options`: the --admin / --token flags every admin client takes)."""
    cache = sub.add_parser("cache", help="response cache administration")
    cache_sub = cache.add_subparsers(dest="cache_command", required=True)
    purge_parser = cache_sub.add_parser("purge", help="drop every entry of one API (O(1))")
    purge_parser.add_argument("--api", required=True)
    admin_options(purge_parser)
    stats_parser = cache_sub.add_parser(
        "stats", help="the store, APIs, rules and hit counters (GET /cache/stats)"
    )
    admin_options(stats_parser)


def command(args: argparse.Namespace, token: str | None) -> int:
    """`rls cache <purge|stats>` as parsed by rls.cli."""
    if args.cache_command == "stats":
        return stats(args.admin, token)
    return purge(args.admin, args.api, token)


def purge(admin_url: str, api: str, token: str | None) -> int:
    """Purge one API's entries; an unknown API's refusal lists the APIs the server has."""
    path = "/cache/purge?" + urllib.parse.urlencode({"api": api})
    return run("cache purge", admin_url, path, {}, token, method="POST")


def stats(admin_url: str, token: str | None) -> int:
    """The cache's counters per API (GET /cache/stats), as JSON on stdout."""
    return run("cache stats", admin_url, "/cache/stats", None, token)
