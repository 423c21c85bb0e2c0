"""The one shape of `rls`'s sub-commands.

Each sub-command is a module of rls.cli, listed in rls.cli.main.COMMANDS, with:

- `NAME`: the word after `rls`;
- `add_parser(sub)`: adds its parser (flags, help) to `rls`'s sub-parsers and returns it;
- `run(args, call)`: runs it as parsed and returns the exit status (0 done, 1 failed or refused,
  2 a usage problem or nothing reachable, as each one's help says).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


@dataclass(frozen=True, slots=True)
class Call:
    """What a sub-command's `run` gets beside its parsed arguments."""

    parser: argparse.ArgumentParser  # its own parser, to report a usage problem with
    argv: Sequence[str]  # the words after `rls` (`serve --workers N` starts its workers with them)
    # (level, line)s `rls serve` logs at start, from a caller that translated the reference's
    # environment itself (the `ratelimit` entry); None: `rls serve` names the reference
    # variables it was given and does not read.
    notes: Sequence[tuple[int, str]] | None = None


class Command(Protocol):
    """A sub-command module (a module satisfies a Protocol by its attributes)."""

    NAME: str

    def add_parser(self, sub: SubParsers) -> argparse.ArgumentParser: ...

    def run(self, args: argparse.Namespace, call: Call) -> int: ...
