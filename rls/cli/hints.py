"""Command-line typos answered by the sub-command that was meant, with a "did you mean".

argparse reports an unknown flag of a sub-command (`rls serve --confg`) through the top-level
parser: the top-level usage, no suggestion. `parse_args` here reports it through the innermost
sub-command's parser instead (its usage, exit 2) and names the closest flag it has; an unknown
sub-command gets the closest sub-command's name.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[
        argparse.ArgumentParser] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _innermost(parser: argparse.ArgumentParser,
               args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the sub-command (of the sub-command...) that `args` went through."""
    sub = _subcommands(parser)
    if sub is None:
        return parser
    chosen = getattr(args, sub.dest, None)
    if chosen not in sub.choices:
        return parser
    return _innermost(sub.choices[chosen], args)


def closest(word: str, options: Sequence[str]) -> str | None:
    found = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return found[0] if found else None


def unrecognized(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """`unrecognized arguments: …`, with "did you mean" for each flag close to a real one."""
    options = [s for action in parser._actions for s in action.option_strings]
    hints = []
    for extra in extras:
        if extra.startswith("-"):
            flag = extra.split("=", 1)[0]
            match = closest(flag, options)
            if match is not None and match != flag:
                hints.append(f"{flag}: did you mean {match}?")
    text = f"unrecognized arguments: {' '.join(extras)}"
    if len(hints) == 1:
        return f"{text} ({hints[0].split(': ', 1)[1]})"
    return f"{text} ({'; '.join(hints)})" if hints else text


def _unknown_command(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """'unknown command' with the closest one, when the first word names no sub-command."""
    sub = _subcommands(parser)
    if sub is None or not argv or argv[0].startswith("-") or argv[0] in sub.choices:
        return None
    match = closest(argv[0], list(sub.choices))
    suggestion = f"; did you mean {match!r}?" if match else ""
    return f"unknown command {argv[0]!r}{suggestion} (choose from {', '.join(sub.choices)})"


def parse_args(parser: argparse.ArgumentParser,
               argv: Sequence[str] | None) -> argparse.Namespace:
    """`parser.parse_args(argv)`, except that mistakes are reported as described above."""
    argv = list(argv) if argv is not None else None
    if argv is not None:
        problem = _unknown_command(parser, argv)
        if problem is not None:
            parser.error(problem)
    args, extras = parser.parse_known_args(argv)
    if extras:
        target = _innermost(parser, args)
        target.error(unrecognized(target, extras))
    return args
