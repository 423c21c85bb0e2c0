"""`rls top`: who is being limited right now, refreshed like `top`.

A thin client of the admin `GET /top` (rls/admin/top.py): every `--interval` seconds it clears
the terminal and prints one table of the descriptors over (or near) their limits, per domain,
summed over the workers. `--once` prints the table once without clearing, for scripts.

In a terminal, `q` quits (as in `top`; Ctrl-C too) and every line is cut to the terminal's
width (ending in `…`) instead of wrapping: a wrapped row breaks the table's columns.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import shutil
import sys
import termios
import tty
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, TextIO

from rls.cli import admin_client
from rls.cli.admin_client import HttpFailure, add_admin_options
from rls.cli.command import Call, SubParsers

NAME = "top"
CLEAR = "\x1b[H\x1b[2J"


def add_parser(sub: SubParsers) -> argparse.ArgumentParser:
    top = sub.add_parser(NAME, help="descriptors over / near their limits now (like top)")
    add_admin_options(top)
    top.add_argument("--domain", help="only this domain")
    top.add_argument("--sort", choices=["over", "near"], default="over")
    top.add_argument("--window", choices=["1m", "5m"], default="1m")
    top.add_argument("--limit", type=int, default=20, help="rows per domain")
    top.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    top.add_argument("--once", action="store_true", help="print once and exit (for scripts)")
    return top


def fetch(args: argparse.Namespace) -> tuple[int, Any]:
    """(HTTP status, JSON payload) of GET /top; status 0 when the admin API is unreachable."""
    query = {"sort": args.sort, "window": args.window, "limit": str(args.limit)}
    if args.domain:
        query["domain"] = args.domain
    path = "/top?" + urllib.parse.urlencode(query)
    try:
        return 200, admin_client.call(args.admin, path, token=args.token)
    except HttpFailure as exc:
        return exc.status, {"error": str(exc).split(": ", 1)[-1]}


def render(payload: dict[str, Any], args: argparse.Namespace) -> str:
    """The table: one row per descriptor, domains in name order, rows in the server's order."""
    stamp = datetime.now(UTC).strftime("%H:%M:%S")
    lines = [
        f"rls top - {args.admin}  window {payload['window']}  sort {payload['sort']}  "
        f"workers {payload['workers']}  {stamp} UTC",
        f"{'DOMAIN':<20} {'OVER':>10} {'NEAR':>10} {'±ERR':>8}  DESCRIPTOR",
    ]
    rows = 0
    for domain, entries in payload["domains"].items():
        for row in entries:
            lines.append(
                f"{domain[:20]:<20} {row['over']:>10} {row['near']:>10} {row['error']:>8}  "
                f"{row['descriptor']}"
            )
            rows += 1
    if rows == 0:
        lines.append(f"(no descriptor {payload['sort']} its limit in the last {payload['window']})")
    candidates = payload.get("candidates") or {}
    if candidates:
        lines += ["", "WOULD BE LIMITED BY CANDIDATE LIMITS (not enforced)"]
        lines += _candidate_rows(candidates)
    return "\n".join(lines) + "\n"


def _candidate_rows(candidates: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The candidate table in the live table's columns (it fits the same 80-column terminal),
    rows grouped under a `<limit> ~ <candidate>` line each, groups in order of appearance."""
    groups: dict[tuple[str, str], list[str]] = {}
    for domain, entries in candidates.items():
        for row in entries:
            groups.setdefault((row["limit"], row["candidate"]), []).append(
                f"{domain[:20]:<20} {row['over']:>10} {row['near']:>10} {row['error']:>8}  "
                f"{row['descriptor']}"
            )
    lines = [f"{'DOMAIN':<20} {'OVER':>10} {'NEAR':>10} {'±ERR':>8}  DESCRIPTOR"]
    for (limit, candidate), rows in groups.items():
        lines += [f"{limit} ~ {candidate}", *rows]
    return lines


def fit(text: str, width: int) -> str:
    """Every line of `text` cut to `width` characters (the last one `…` when cut)."""
    return "\n".join(
        line if len(line) <= width else line[: width - 1] + "…" for line in text.split("\n")
    )


@contextlib.contextmanager
def keys(stream: TextIO) -> Iterator[bool]:
    """The terminal in cbreak mode (a key arrives without Enter; Ctrl-C still interrupts)
    while the view runs, restored after; yields whether keys can be read at all."""
    if not stream.isatty():
        yield False
        return
    fd = stream.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def quit_pressed(stream: TextIO, seconds: float) -> bool:
    """Wait up to `seconds` for a key: True when it was `q` (or `Q`)."""
    ready, _, _ = select.select([stream], [], [], seconds)
    return bool(ready) and b"q" in os.read(stream.fileno(), 64).lower()


def watch(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """The table every --interval seconds until `q` (or once, with --once)."""
    if args.once:
        return _show(args, out)
    with keys(sys.stdin) as interactive:
        while True:
            _show(args, out)
            if interactive:
                if quit_pressed(sys.stdin, args.interval):
                    return 0
            else:
                select.select([], [], [], args.interval)


def _show(args: argparse.Namespace, out: TextIO) -> int:
    """Fetch and print once (cleared and cut to the terminal's width unless --once)."""
    try:
        status, payload = fetch(args)
    except OSError as exc:
        status, payload = 0, {"error": str(exc)}
    if status == 200:
        text = render(payload, args)
    else:
        error = payload.get("error") if isinstance(payload, dict) else payload
        text = f"rls top: {args.admin}: {status or 'unreachable'}: {error}\n"
    if args.once:
        (out if status == 200 else sys.stderr).write(text)
        return 0 if status == 200 else 1
    text += "q: quit\n"
    width = shutil.get_terminal_size().columns if out.isatty() else None
    out.write(CLEAR + (fit(text, width) if width else text))
    out.flush()
    return 0 if status == 200 else 1


def run(args: argparse.Namespace, call: Call) -> int:
    try:
        return watch(args)
    except KeyboardInterrupt:
        return 0
