"""`rls usage`: a domain's usage statistics through the admin API (GET /usage)."""

from __future__ import annotations

import argparse
import datetime
import urllib.parse

from rls.cli.admin_client import add_admin_options, fail, report
from rls.cli.command import Call, SubParsers

NAME = "usage"


def _day(text: str) -> str:
    """`--day` must be a real YYYYMMDD date (the admin API would silently answer 0)."""
    try:
        datetime.datetime.strptime(text, "%Y%m%d")
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date as YYYYMMDD") from None
    return text


def add_parser(sub: SubParsers) -> argparse.ArgumentParser:
    usage = sub.add_parser(NAME, help="usage statistics of a domain")
    add_admin_options(usage)
    usage.add_argument("--domain", required=True)
    usage.add_argument("--day", type=_day, help="YYYYMMDD (default today)")
    usage.add_argument("--distinct", metavar="KEY", help="count distinct values of KEY")
    usage.add_argument("values", nargs="*", help="key=value of the statistic's keys")
    return usage


def run(args: argparse.Namespace, call: Call) -> int:
    query: dict[str, str] = {"domain": args.domain}
    if args.day:
        query["day"] = args.day
    if args.distinct:
        query["distinct"] = args.distinct
    for item in args.values:
        key, sep, value = item.partition("=")
        if not key or not sep:
            return fail(NAME, f"statistic keys are key=value, got {item!r}")
        query[key] = value
    return report(NAME, args.admin, "/usage?" + urllib.parse.urlencode(query), None, args.token)
