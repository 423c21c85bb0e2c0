"""`rls switches`: show the runtime switches, or change them, through the admin API
(/switches); a switch not named stays as it is."""

from __future__ import annotations

import argparse

from rls.cli.admin_client import add_admin_options, report
from rls.cli.command import Call, SubParsers

NAME = "switches"


def add_parser(sub: SubParsers) -> argparse.ArgumentParser:
    switches = sub.add_parser(NAME, help="show or change runtime switches")
    add_admin_options(switches)
    switches.add_argument("--shadow-mode", choices=["on", "off"], help="default: unchanged")
    switches.add_argument("--limiting-off", choices=["on", "off"], help="default: unchanged")
    switches.add_argument(
        "--shadow-domains", help="comma-separated domains ('' for none; default: unchanged)"
    )
    return switches


def run(args: argparse.Namespace, call: Call) -> int:
    changes: dict[str, object] = {}
    if args.shadow_mode:
        changes["shadow_mode"] = args.shadow_mode == "on"
    if args.limiting_off:
        changes["limiting_off"] = args.limiting_off == "on"
    if args.shadow_domains is not None:
        changes["shadow_domains"] = [d for d in args.shadow_domains.split(",") if d]
    return report(NAME, args.admin, "/switches", changes or None, args.token)
