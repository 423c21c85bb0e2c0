"""`rls cache purge --api NAME` and `rls cache stats`: the response cache through the admin
API (POST /cache/purge, GET /cache/stats)."""

from __future__ import annotations

import argparse
import urllib.parse

from rls.cli.admin_client import add_admin_options, report
from rls.cli.command import Call, SubParsers

NAME = "cache"


def add_parser(sub: SubParsers) -> argparse.ArgumentParser:
    cache = sub.add_parser(NAME, help="response cache administration")
    cache_sub = cache.add_subparsers(dest="cache_command", required=True)
    purge_parser = cache_sub.add_parser("purge", help="drop every entry of one API (O(1))")
    purge_parser.add_argument("--api", required=True)
    add_admin_options(purge_parser)
    stats_parser = cache_sub.add_parser(
        "stats", help="the store, APIs, rules and hit counters (GET /cache/stats)"
    )
    add_admin_options(stats_parser)
    return cache


def run(args: argparse.Namespace, call: Call) -> int:
    if args.cache_command == "stats":
        return stats(args.admin, args.token)
    return purge(args.admin, args.api, args.token)


def purge(admin_url: str, api: str, token: str | None) -> int:
    """Purge one API's entries; an unknown API's refusal lists the APIs the server has."""
    path = "/cache/purge?" + urllib.parse.urlencode({"api": api})
    return report("cache purge", admin_url, path, {}, token, method="POST")


def stats(admin_url: str, token: str | None) -> int:
    """The cache's counters per API (GET /cache/stats), as JSON on stdout."""
    return report("cache stats", admin_url, "/cache/stats", None, token)
