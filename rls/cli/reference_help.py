"""envoyproxy/ratelimit's variables explained to the operator, by who reads them.

Two readers: the `ratelimit` entry (`/bin/ratelimit`) reads every variable
rls.settings.reference_env honours, and `rls serve` reads the subset that rls.settings maps to
its settings (plus the REDIS_URL shapes and, with tracing, the OpenTelemetry SDK's OTEL_*). What
only the entry reads (its ENTRY_ENV: listeners, the runtime directory, the Prometheus listener)
`rls serve` takes as flags instead. From those same tables this module derives `ratelimit
--help`'s list (grouped by reader, each variable with its default) and `rls serve`'s start-up
line naming the reference variables it was given and does not read, so that neither stays
silent.
"""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Mapping
from dataclasses import fields

from rls.settings import Settings
from rls.settings.environment import REFERENCE_ENV, REFERENCE_ENV_FALLBACK
from rls.settings.reference_env import (
    DOCS,
    ENTRY_ENV,
    FOLLOWS,
    REDIS_URL_ENV,
    REFERENCE_VARIABLES,
    honoured,
)

HELP_SECTION = f"{DOCS}#what-binratelimit-reads"
WIDTH = 100


def _setting_of() -> dict[str, str]:
    """Reference variable -> the Settings field it sets (fallback names included)."""
    return {**{var: name for name, var in REFERENCE_ENV_FALLBACK.items()},
            **{var: name for name, var in REFERENCE_ENV.items()}}


def entry_only() -> frozenset[str]:
    """The variables the `ratelimit` entry reads and `rls serve` does not."""
    return frozenset(ENTRY_ENV) - frozenset(_setting_of())


def read_by_serve() -> frozenset[str]:
    """The reference variables `rls serve` reads."""
    return honoured() - entry_only()


def serve_ignored(environ: Mapping[str, str]) -> list[str]:
    """The reference variables set in `environ` that `rls serve` does not read, sorted."""
    known = read_by_serve()
    return sorted(n for n in REFERENCE_VARIABLES if n in environ and n not in known)


def serve_note(environ: Mapping[str, str]) -> tuple[int, str] | None:
    """`rls serve`'s start-up line naming the reference variables it ignores (None: none set).

    Those only the `ratelimit` entry reads are named apart: setting them is not a mistake under
    `/bin/ratelimit`, and under `rls serve` their flags do the same."""
    unread = serve_ignored(environ)
    if not unread:
        return None
    line = f"reference variables set but ignored by rls serve: {', '.join(unread)}"
    by_entry = [n for n in unread if n in ENTRY_ENV]
    if by_entry:
        line += (f"; {', '.join(by_entry)} only under the `ratelimit` entry (/bin/ratelimit), "
                 "rls serve takes flags instead (rls serve --help)")
    return logging.WARNING, f"{line} (see {DOCS})"


def _default(name: str) -> str:
    value = {f.name: f.default for f in fields(Settings)}[name]
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value) if value != "" else "unset"


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _settings_lines() -> list[tuple[str, str]]:
    """(variable, what it sets) of every variable rls.settings maps, sorted by name (which
    keeps CONFIG_GRPC_XDS_*, GRPC_*, REDIS_*, TRACING_* together)."""
    # rls.cli.serve imports this module (serve_note): its help texts are read on use.
    from rls.cli.serve import FLAGS

    setting_of = _setting_of()
    out = []
    for var in sorted(setting_of):
        name = setting_of[var]
        if var in ENTRY_ENV:
            text = f"{ENTRY_ENV[var]} (default {_default(name)})"
        else:
            text = f"{_flag(name)} (default {_default(name)}): {FLAGS.get(name, '')}".rstrip(": ")
        if var in REFERENCE_ENV_FALLBACK.values():
            text += f"; read when {REFERENCE_ENV[name]} is unset"
        out.append((var, text))
    return out


def _groups() -> list[tuple[str, list[tuple[str, str]]]]:
    return [
        ("read by /bin/ratelimit itself, turned into `rls serve` flags",
         [(n, ENTRY_ENV[n]) for n in sorted(entry_only())]),
        ("settings, read by `rls serve` too (an RLS_<NAME> variable or a flag wins)",
         _settings_lines()),
        ("how a REDIS_URL without a scheme (host:port, /path) becomes a URL (all unset: "
         "redis:// or unix:// to one server; docs/migration.md)",
         [(n, "") for n in REDIS_URL_ENV]),
        *((f"read by the OpenTelemetry SDK when {leader}=true",
           [(n, "") for n in sorted(REFERENCE_VARIABLES) if n.startswith(prefix)])
          for prefix, leader in FOLLOWS.items()),
    ]


def _wrap(text: str, indent: str = "", hanging: str = "") -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=hanging,
                         break_on_hyphens=False, break_long_words=False)


def entry_help(usage: str) -> str:
    """`ratelimit --help`: `usage`, then every variable the entry reads, grouped by reader."""
    out = [usage, ""]
    for title, items in _groups():
        out += _wrap(f"{title}:")
        for var, text in items:
            out += _wrap(f"{var}  {text}".rstrip(), "  ", "      ")
        out.append("")
    out += _wrap("Any other reference variable set is named at start in one line as ignored. "
                 f"Envoy Gateway's values, variable by variable: {HELP_SECTION}")
    return "\n".join(out)
