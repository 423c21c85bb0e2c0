"""`rls counters`: the counters of a domain's descriptors through the admin API, queried (POST
/counters, nothing charged) or, with `--add HITS`, charged (POST /add)."""

from __future__ import annotations

import argparse
import re
from typing import Any

from rls.cli.admin_client import add_admin_options, fail, report
from rls.cli.command import Call, SubParsers

NAME = "counters"


def add_parser(sub: SubParsers) -> argparse.ArgumentParser:
    counters = sub.add_parser(NAME, help="query counters (no charge) or add hits")
    add_admin_options(counters)
    counters.add_argument("--domain", required=True)
    counters.add_argument(
        "-d", "--descriptor", action="append", required=True,
        help="key=value[,key=value…] (repeatable); a comma inside a value: write \\,",
    )
    counters.add_argument("--add", type=int, metavar="HITS", help="charge HITS instead of querying")
    return counters


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


def run(args: argparse.Namespace, call: Call) -> int:
    try:
        descriptors = [parse_descriptor(d) for d in args.descriptor]
    except ValueError as exc:
        return fail(NAME, str(exc))
    item: dict[str, Any] = {"domain": args.domain, "descriptors": descriptors}
    if args.add is None:
        return report(NAME, args.admin, "/counters", item, args.token)
    if args.add:
        item["hitsAddend"] = args.add
    return report(NAME, args.admin, "/add", {"items": [item]}, args.token)
