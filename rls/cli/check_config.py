"""`rls check-config`: every config file checked offline, each kind by its own rules.

Descriptor files, response cache rules and frequency counters configs are told apart (see the
sub-command's description) or named by a flag; `rls serve` (rls.cli.serve) uses
empty_directories too, for its start-up warning and --strict refusal.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from rls.cli.command import Call, SubParsers
from rls.config.errors import ConfigError, ConfigWarning
from rls.config.key_wildcards import offline_notes
from rls.config.loader import discover, load_files, read_text, yaml_files_under
from rls.config.yaml_source import parse_yaml
from rls.frequency.model import is_counters_doc
from rls.frequency.model import load_config as load_counters_config
from rls.response_cache import check_cache_file, is_cache_file

NAME = "check-config"


def add_parser(sub: SubParsers) -> argparse.ArgumentParser:
    check = sub.add_parser(
        NAME, help="validate descriptor, cache rules and counters config files",
        description="Validate config files offline, each kind by its own rules. A file given "
        "as a path is a cache rules file when it has `rules:` (or is a list of `api:` items), a "
        "counters config when it has counters fields (default_timezone, domains, stale_cache, "
        "hot_keys, timeout_ms) and no `domain`/`descriptors`, else a descriptor file; files "
        "inside directories are descriptor or cache rules files, as `rls serve --config` reads "
        "them. --cache-config and --counters-config name a file's kind outright.",
    )
    check.add_argument("paths", nargs="*",
                       help="descriptor, cache rules or counters config files, directories")
    check.add_argument(
        "--config", action="append", default=[], metavar="PATH", dest="config_paths",
        help="same as a path argument (as `rls serve --config`); repeatable",
    )
    check.add_argument(
        "--cache-config", action="append", default=[], metavar="FILE", dest="cache_paths",
        help="a response cache rules file (as `rls serve --cache-config`); repeatable",
    )
    check.add_argument(
        "--counters-config", action="append", default=[], metavar="FILE",
        dest="counters_paths",
        help="a frequency counters config file (as `rls serve --counters-config`); repeatable",
    )
    check.add_argument(
        "--merge-domains", action="store_true",
        help="allow one domain to span several files (default off)",
    )
    check.add_argument(
        "--config-all-files", action="store_true", dest="every_file",
        help="read every file of a directory, not only *.yaml / *.yml (as `rls serve "
        "--config-all-files` and /bin/ratelimit do; default off)",
    )
    check.add_argument(
        "--strict", action="store_true",
        help="warnings (repeated YAML key, rate_limit without requests_per_unit, empty "
        "directory) fail the check (default off)",
    )
    return check


def _quiet(_message: str) -> None:
    """For the extra walks of a directory: discover() already reports each skipped entry."""


def cache_files_in(paths: Sequence[str], every_file: bool = False) -> list[str]:
    """Cache rule files inside the given directories (discover() leaves them out)."""
    return [
        f for p in paths if os.path.isdir(p)
        for f in yaml_files_under(p, _quiet, every_file) if is_cache_file(f)
    ]


def empty_directories(paths: Sequence[str], every_file: bool = False) -> list[ConfigWarning]:
    """Directories among `paths` with no file to read at all: a wrong mount or path, usually."""
    what = "files" if every_file else "files (*.yaml, *.yml)"
    return [
        ConfigWarning(p, f"directory has no descriptor {what}")
        for p in paths
        if os.path.isdir(p) and not yaml_files_under(p, _quiet, every_file)
    ]


def is_counters_file(path: str) -> bool:
    """A counters config (`--counters-config`), told apart from a descriptor file by its
    top-level fields; unreadable or invalid YAML is not one (the descriptor loader says why)."""
    try:
        return is_counters_doc(parse_yaml(path, read_text(path)))
    except ConfigError:
        return False


def check_counters_file(path: str) -> None:
    """Raise ConfigError when the counters config would not load in `rls serve`."""
    try:
        load_counters_config(path)
    except (ValueError, TypeError, AttributeError) as exc:
        text = str(exc).removeprefix(f"{path}: ")
        raise ConfigError(path, f"counters config: {text}") from None


def check_config(paths: Sequence[str], merge_domains: bool, strict: bool = False,
                 cache_paths: Sequence[str] = (), counters_paths: Sequence[str] = (),
                 every_file: bool = False) -> int:
    """Validate every file; print `file: message (at file:line, node path)` per error and
    `file: warning: …` per warning; exit 1 on any error (or warning with --strict).

    Cache rules files and counters configs among the named files are recognised (see the
    sub-command's description) or named by `cache_paths` / `counters_paths`."""
    errors = 0
    files: list[tuple[str, str]] = []
    warnings = empty_directories(paths, every_file)
    named = {p for p in paths if os.path.isfile(p)}
    try:
        names = discover(paths, every_file) + cache_files_in(paths, every_file)
    except ConfigError as exc:
        print(exc.detail(), file=sys.stderr)
        return 1
    # A file named by a flag and also found in a directory is checked (and counted) once.
    names = list(dict.fromkeys([*names, *cache_paths, *counters_paths]))
    counters = 0
    for name in names:
        try:
            if name in counters_paths or (name in named and name not in cache_paths
                                          and is_counters_file(name)):
                check_counters_file(name)
                counters += 1
                continue
            if name in cache_paths or is_cache_file(name):
                check_cache_file(name)
                continue
            text = read_text(name)
            alone = load_files([(name, text)], merge_domains=True)
            warnings += [*alone.warnings, *offline_notes(name, alone)]
            files.append((name, text))
        except ConfigError as exc:
            print(exc.detail(), file=sys.stderr)
            errors += 1
    for warning in warnings:
        print(warning, file=sys.stderr)
    if not errors:
        try:  # cross-file conditions: duplicate domains, duplicate nodes when merging
            config = load_files(files, merge_domains)
        except ConfigError as exc:
            print(exc.detail(), file=sys.stderr)
            return 1
        if strict and warnings:
            print(f"FAILED (--strict): {len(warnings)} warning(s)", file=sys.stderr)
            return 1
        cache_count = len(names) - len(files) - counters
        print(
            f"OK: {len(files)} descriptor file(s), {len(config.domains)} domain(s), "
            f"{cache_count} cache rules file(s)"
            + (f", {counters} counters config file(s)" if counters else "")
            + (f", {len(warnings)} warning(s)" if warnings else "")
        )
    return 1 if errors else 0


def run(args: argparse.Namespace, call: Call) -> int:
    """`rls check-config` as parsed; no file named at all is a usage error."""
    paths = [*args.paths, *args.config_paths]
    if not (paths or args.cache_paths or args.counters_paths):
        call.parser.error("give the files or directories to check (paths, or --config PATH)")
    return check_config(paths, args.merge_domains, args.strict, args.cache_paths,
                        args.counters_paths, args.every_file)
