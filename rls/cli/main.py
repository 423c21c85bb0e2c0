"""The `rls` command: one parser with every sub-command on it, and the run of the one named.

Every sub-command is a module of this package of the shape rls.cli.command describes; COMMANDS
lists them in the order `rls --help` shows them. A mistake on the command line is answered by
the sub-command that was meant, with a "did you mean" (rls.cli.hints).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import metadata

from rls.cli import cache, check_config, counters, demo, replay, serve, switches, top, usage
from rls.cli.command import Call, Command
from rls.cli.hints import parse_args

COMMANDS: tuple[Command, ...] = (
    serve, check_config, counters, usage, switches, cache, top, demo, replay,
)


def _version() -> str:
    try:
        return metadata.version("rls")
    except metadata.PackageNotFoundError:
        return "unknown"


def _parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """`rls`'s parser, and each sub-command's own by its name."""
    parser = argparse.ArgumentParser(prog="rls", description="Envoy rate-limit service")
    parser.add_argument("--version", action="version", version=f"rls {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    return parser, {command.NAME: command.add_parser(sub) for command in COMMANDS}


def parser() -> argparse.ArgumentParser:
    """`rls`'s parser with every sub-command (the docs' command lines are checked with it)."""
    return _parsers()[0]


def main(
    argv: Sequence[str] | None = None, notes: Sequence[tuple[int, str]] | None = None
) -> int:
    """`rls ARGV`; `notes`: (level, line)s `rls serve` logs at start (the `ratelimit` entry's;
    None: `rls serve` names the reference variables it was given and does not read)."""
    words = list(sys.argv[1:] if argv is None else argv)
    parser, own = _parsers()
    args = parse_args(parser, words)  # a typo: the sub-command's usage, "did you mean"
    command = next(c for c in COMMANDS if c.NAME == args.command)
    return command.run(args, Call(own[args.command], words, notes))
