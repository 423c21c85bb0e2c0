"""One descriptor node's `rate_limit:` / `rate_limits:` specs into Limits.

Apart from the descriptor-tree parser (`rls/config/parser.py`) because a limit spec is a small
language of its own: units and the reference's `unlimited` / `replaces` rules, then rls's
extensions (algorithms, unit multipliers, burst, overdraft, calendars, windows,
charging) and which combinations of them mean something. The tree parser only says where a
spec sits. Messages, the order in which they are checked and the field they point at are the
reference's (or pinned by tests), so each step below keeps its place in `limit`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rls.config.errors import ConfigError, ConfigWarning, Problems, did_you_mean
from rls.config.model import MAX_WINDOW_SECONDS, UNIT_SECONDS, Limit, Unit
from rls.config.reserve_parser import parse_reserve
from rls.config.yaml_source import as_bool, as_list, as_str, as_uint, line_of
from rls.core.algorithms.registry import ALGORITHM_NAMES as ALGORITHMS
from rls.core.algorithms.registry import BURST_ALGORITHMS
from rls.core.limits import (
    CHARGE_DEFAULT,
    CHARGES,
    RESERVABLE_ALGORITHMS,
    WINDOW_ALIGNED,
    WINDOW_ROLLING,
    WINDOWS,
)

# The fields of one limit spec (`rate_limit:` or an item of `rate_limits:`). The key check of
# rls/config/parser.py accepts them at any depth, like the reference, so one indented a level
# too little (beside an empty `rate_limit:`) would be ignored without a word: it is a warning.
SPEC_FIELDS = (
    "unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm",
    "unit_multiplier", "burst", "overdraft", "calendar", "window", "timezone", "charge",
    "accept_releases", "reserve",
)
LIMIT_KEYS = ("rate_limit", "rate_limits")


def stray_limit_fields(
    file: str, raw: dict[str, Any], path: str, keys: tuple[str, ...], why: str
) -> list[ConfigWarning]:
    """Warnings for limit fields (`keys`) in a mapping where nothing reads them (a descriptor
    node, the top of a file): `'<key>' <why>`."""
    return [
        ConfigWarning(
            file,
            f"'{key}' {why}",
            line_of(raw, key),
            f"{path}.{key}" if path else key,
        )
        for key in keys
        if key in raw
    ]


# `candidates:` entries: what a candidate may set (the rest is the live limit's), what it
# inherits from the live spec when it sets no unit / algorithm of its own, and its name's form.
CANDIDATE_KEYS = frozenset({
    "name", "requests_per_unit", "unit", "unit_multiplier", "algorithm", "burst", "overdraft",
    "calendar", "window", "timezone",
})
_UNIT_KEYS = ("unit", "unit_multiplier")
_ALGORITHM_KEYS = ("algorithm", "burst", "overdraft", "calendar", "window", "timezone")
_INHERITED = ("charge", "accept_releases")
CANDIDATE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_CANDIDATES = 8  # per live limit: each one is a counter more per request


UNIT_NAMES = tuple(unit.name.lower() for unit in UNIT_SECONDS)


def unit_hint(text: str) -> str:
    """`did you mean 'minute'?` (when one is close) and the valid units, for a bad `unit:`."""
    close = did_you_mean(text.lower(), UNIT_NAMES)
    valid = f"valid units: {', '.join(UNIT_NAMES)}"
    return f"{close} {valid}" if close else valid


def parse_unit(text: str) -> Unit | None:
    try:
        unit = Unit[text.upper()]
    except KeyError:
        return None
    return None if unit is Unit.UNKNOWN else unit


class LimitParser:
    """Parses the limit specs of one file's nodes; warnings go to the file's shared list."""

    def __init__(self, file: str, warnings: list[ConfigWarning]) -> None:
        self.file = file
        self.warnings = warnings

    def fail(self, message: str, field: str | None = None) -> ConfigError:
        return ConfigError(self.file, message, field=field)

    def node_limits(
        self, raw: dict[str, Any], path: str, shadow: bool, quota: bool
    ) -> list[Limit]:
        """The limits of the node at `path`: `rate_limit:` first, then each of `rate_limits:`,
        checked as a set and given distinct metric keys when there are several."""
        self._check_placement(raw, path)
        specs: list[Any] = []
        if raw.get("rate_limit") is not None:
            specs.append(raw["rate_limit"])
        specs.extend(as_list(self.file, raw.get("rate_limits"), "rate_limits"))
        limits: list[Limit] = []
        single = raw.get("rate_limit") is not None
        found = Problems()  # each spec's problems are independent of the others'
        for index, spec in enumerate(specs):
            where = "rate_limit" if single and not index else f"rate_limits[{index - single}]"
            limit = found.check(
                None, self._located_limit, spec, path, where, shadow, quota, index
            )
            if limit is not None:
                limits.append(limit)
        found.raise_if_any()
        self._check_limit_set(limits, path)
        if len(limits) > 1:
            distinct_metric_keys(limits, path)
        if raw.get("candidates") is not None and not single:
            raise self.fail(
                f"'{path}': candidates next to rate_limits: put them inside each "
                "rate_limits entry they stand beside", "candidates",
            )
        for index, spec in enumerate(specs):
            given = as_list(self.file, spec.get("candidates"), "candidates")
            if single and not index:
                given = as_list(self.file, raw.get("candidates"), "candidates") + given
            if given:
                where = "rate_limit" if single and not index else f"rate_limits[{index - single}]"
                limits[index] = self._with_candidates(limits[index], spec, given, path, where)
        return limits

    def _check_placement(self, raw: dict[str, Any], path: str) -> None:
        """Limit fields on the node itself, and an empty `rate_limit:`, are warnings: both are
        what a field indented one level too little looks like, and both leave the node without
        the limit its author wrote (every request allowed)."""
        self.warnings += stray_limit_fields(
            self.file, raw, path, SPEC_FIELDS,
            "is a rate limit field on the descriptor itself, where it is ignored: "
            "indent it under rate_limit:",
        )
        if "rate_limit" in raw and raw["rate_limit"] is None:
            self.warnings.append(
                ConfigWarning(
                    self.file,
                    "empty rate_limit: this node has no limit (are its fields indented "
                    "under it?)",
                    line_of(raw, "rate_limit"),
                    f"{path}.rate_limit",
                )
            )

    def _with_candidates(
        self, live: Limit, spec: dict[str, Any], given: list[Any], path: str, where: str
    ) -> Limit:
        """`live` with its candidate limits: each entry is the live spec with the entry's
        fields in place (its unit and algorithm settings when it names its own)."""
        at = f"{path}.{where}.candidates"
        if live.unlimited:
            raise self.fail(f"'{at}': an unlimited limit has no count to compare candidates with")
        if len(given) > MAX_CANDIDATES:
            raise self.fail(f"'{at}': at most {MAX_CANDIDATES} candidates per limit")
        out: list[Limit] = []
        for i, entry in enumerate(given):
            try:
                out.append(self._candidate(live, spec, entry, f"'{at}[{i}]'"))
            except ConfigError as exc:
                raise exc.locate_in(entry, f"{at}[{i}]") from None
            if out[-1].candidate in (c.candidate for c in out[:-1]):
                raise self.fail(
                    f"'{at}[{i}]': two candidates named '{out[-1].candidate}'", "name"
                ).locate(line_of(entry, "name"), f"{at}[{i}]")
        return dataclasses.replace(live, candidates=tuple(out))

    def _candidate(self, live: Limit, spec: dict[str, Any], entry: Any, at: str) -> Limit:
        if not isinstance(entry, dict):
            raise self.fail(f"{at}: a candidate must be a map (name, requests_per_unit, ...)")
        for key in entry:
            if key not in CANDIDATE_KEYS:
                raise self.fail(
                    f"{at}: '{key}' cannot be set on a candidate (it may set "
                    f"{', '.join(sorted(CANDIDATE_KEYS))}; the rest is the live limit's)", key,
                )
        name = as_str(self.file, entry.get("name"), "name")
        if not CANDIDATE_NAME.fullmatch(name):
            raise self.fail(
                f"{at}: a candidate needs a name of 1 to 64 letters, digits, '_', '.' or '-'",
                "name",
            )
        if entry.get("requests_per_unit") is None:
            raise self.fail(f"{at}: a candidate needs requests_per_unit", "requests_per_unit")
        merged: dict[str, Any] = {k: spec[k] for k in _INHERITED if k in spec}
        if "unit" not in entry:
            merged.update((k, spec[k]) for k in _UNIT_KEYS if k in spec)
        if "algorithm" not in entry:
            merged.update((k, spec[k]) for k in _ALGORITHM_KEYS if k in spec)
        merged.update((k, v) for k, v in entry.items() if k != "name")
        base = self.limit(merged, at.strip("'"), live.shadow_mode, live.quota_mode, 0)
        return dataclasses.replace(
            base, candidate=name, full_key=live.full_key, ident=""
        )

    def _located_limit(
        self, spec: Any, path: str, where: str, shadow: bool, quota: bool, index: int
    ) -> Limit:
        """One spec; its errors point at the spec's line (or its faulty field's) and at
        `path.where`, and a limit without requests_per_unit is a warning."""
        if not isinstance(spec, dict):
            raise self.fail(
                "error loading config file: yaml: unmarshal errors: rate_limit must be a map",
                field="rate_limit" if where == "rate_limit" else "rate_limits",
            )
        try:
            limit = self.limit(spec, path, shadow, quota, index)
        except ConfigError as exc:
            raise exc.locate_in(spec, f"{path}.{where}") from None
        if spec.get("requests_per_unit") is None and not limit.unlimited:
            self.warnings.append(
                ConfigWarning(
                    self.file,
                    "rate_limit without requests_per_unit: the limit is 0, "
                    "every request is over it",
                    line_of(spec),
                    f"{path}.{where}",
                )
            )
        return limit

    def _check_limit_set(self, limits: list[Limit], path: str) -> None:
        if len(limits) > 1 and any(lim.unlimited for lim in limits):
            raise self.fail(f"'{path}': unlimited cannot be combined with other rate limits")
        seen: set[str] = set()
        for lim in limits:
            if lim.ident in seen:
                raise self.fail(
                    f"'{path}': two rate limits with the same algorithm and window; "
                    "give one a different unit, unit_multiplier or algorithm"
                )
            seen.add(lim.ident)

    def limit(
        self, spec: dict[str, Any], path: str, shadow: bool, quota: bool, index: int
    ) -> Limit:
        """One spec into a Limit. Each field is read on its own and every bad one reported
        (as the reference's YAML unmarshalling reports every bad type at once); combinations
        of fields are checked only when every field read (they depend on the fields)."""
        f = self.file
        found = Problems()
        unlimited, unit, unit_text = found.check((False, Unit.UNKNOWN, ""), self._unit, spec)
        name = found.check("", as_str, f, spec.get("name"), "name")
        replaces: set[str] = found.check(set(), self._replaces, spec, name)
        algorithm = found.check("fixed_window", self._algorithm, spec, path)
        multiplier = found.check(1, self._multiplier, spec, path, unit)
        burst = None if spec.get("burst") is None else found.check(
            None, as_uint, f, spec.get("burst"), "burst"
        )
        overdraft = found.check(0, as_uint, f, spec.get("overdraft"), "overdraft")
        calendar = found.check(False, as_bool, f, spec.get("calendar"), "calendar")
        rolling = found.check(False, self._rolling, spec, path)
        timezone = found.check("UTC", self._timezone, spec, path)
        rpu = found.check(0, as_uint, f, spec.get("requests_per_unit"), "requests_per_unit")
        charge = found.check(CHARGE_DEFAULT, self._charge, spec, path)
        accept = spec.get("accept_releases")
        accept_releases = None if accept is None else found.check(
            None, as_bool, f, accept, "accept_releases"
        )
        reserve = None if spec.get("reserve") is None else found.check(
            None, parse_reserve, f, spec.get("reserve"), path
        )
        found.raise_if_any()
        self._check_extensions(
            path, algorithm, burst, overdraft, calendar, rolling, spec, unit, unlimited
        )
        if reserve is not None:
            self._check_reserve(path, algorithm, unlimited, overdraft)
        if overdraft > rpu:
            raise self.fail(f"'{path}': overdraft must not exceed requests_per_unit")
        if not unlimited and unit not in UNIT_SECONDS:
            raise ConfigError(
                f, f"invalid rate limit unit '{unit_text}'", hint=unit_hint(unit_text)
            )
        return Limit(
            requests_per_unit=rpu, unit=unit, name=name, unlimited=unlimited,
            shadow_mode=shadow, quota_mode=quota, replaces=frozenset(replaces),
            algorithm=algorithm, unit_multiplier=multiplier, burst=burst, overdraft=overdraft,
            calendar=calendar, rolling=rolling, timezone=timezone,
            charge_always=charge == "always", costs_on_allow=charge == "on_allow",
            accept_releases=accept_releases, reserve=reserve,
            full_key=path, index=index,
        )

    def _check_reserve(self, path: str, algorithm: str, unlimited: bool, overdraft: int) -> None:
        """`reserve:` needs a count whose charge and release are exact inverses in a window:
        the algorithms quota mode can deal (rls.quota.share), without overdraft debt."""
        if unlimited:
            raise self.fail(f"'{path}': reserve on an unlimited limit has nothing to hold",
                            "reserve")
        if algorithm not in RESERVABLE_ALGORITHMS:
            raise self.fail(
                f"'{path}': reserve applies to {', '.join(sorted(RESERVABLE_ALGORITHMS))}, "
                f"not {algorithm}", "reserve",
            )
        if overdraft:
            raise self.fail(f"'{path}': reserve cannot be combined with overdraft", "reserve")

    def _unit(self, spec: dict[str, Any]) -> tuple[bool, Unit, str]:
        """`unlimited:` and `unit:` (none when unlimited, a known one otherwise)."""
        unlimited = as_bool(self.file, spec.get("unlimited"), "unlimited")
        unit_text = as_str(self.file, spec.get("unit"), "unit")
        unit = parse_unit(unit_text)
        if unlimited:
            if unit is not None:
                raise self.fail("should not specify rate limit unit when unlimited", "unit")
            unit = Unit.UNKNOWN
        elif unit is None:
            raise ConfigError(
                self.file, f"invalid rate limit unit '{unit_text}'", field="unit",
                hint=unit_hint(unit_text),
            )
        return unlimited, unit, unit_text

    def _replaces(self, spec: dict[str, Any], name: str) -> set[str]:
        """`replaces:` — names of other limits, none empty and not this limit's own."""
        replaces: set[str] = set()
        for entry in as_list(self.file, spec.get("replaces"), "replaces"):
            rname = as_str(self.file, entry.get("name"), "name") if isinstance(entry, dict) else ""
            if not rname:
                raise self.fail("should not have an empty replaces entry", "replaces")
            if rname == name:
                raise self.fail("replaces should not contain name of same descriptor", "replaces")
            replaces.add(rname)
        return replaces

    def _algorithm(self, spec: dict[str, Any], path: str) -> str:
        algorithm = as_str(self.file, spec.get("algorithm"), "algorithm") or "fixed_window"
        if algorithm not in ALGORITHMS:
            raise self.fail(
                f"'{path}': unknown algorithm '{algorithm}' (one of {', '.join(ALGORITHMS)})",
                "algorithm",
            )
        return algorithm

    def _multiplier(self, spec: dict[str, Any], path: str, unit: Unit) -> int:
        """`unit_multiplier:` — at least 1, and the window no longer than 100 years."""
        given = spec.get("unit_multiplier")
        multiplier = 1 if given is None else as_uint(self.file, given, "unit_multiplier")
        if multiplier < 1:
            raise self.fail(f"'{path}': unit_multiplier must be at least 1")
        if unit in UNIT_SECONDS and UNIT_SECONDS[unit] * multiplier > MAX_WINDOW_SECONDS:
            raise self.fail(f"'{path}': unit x unit_multiplier is longer than 100 years")
        return multiplier

    def _rolling(self, spec: dict[str, Any], path: str) -> bool:
        """`window:` — aligned (default) or rolling_from_first_hit."""
        window = as_str(self.file, spec.get("window"), "window") or WINDOW_ALIGNED
        if window not in WINDOWS:
            raise self.fail(
                f"'{path}': unknown window '{window}' (one of {', '.join(WINDOWS)})", "window"
            )
        return window == WINDOW_ROLLING

    def _timezone(self, spec: dict[str, Any], path: str) -> str:
        """`timezone:` — UTC unless given, and then one the zone database knows."""
        timezone = as_str(self.file, spec.get("timezone"), "timezone") or "UTC"
        if spec.get("timezone") is not None:
            try:
                ZoneInfo(timezone)
            except (ZoneInfoNotFoundError, ValueError):
                raise self.fail(f"'{path}': unknown timezone '{timezone}'", "timezone") from None
        return timezone

    def _charge(self, spec: dict[str, Any], path: str) -> str:
        charge = as_str(self.file, spec.get("charge"), "charge") or CHARGE_DEFAULT
        if charge not in CHARGES:
            raise self.fail(
                f"'{path}': charge must be one of {', '.join(CHARGES)}, not '{charge}'", "charge"
            )
        return charge

    def _check_extensions(
        self,
        path: str,
        algorithm: str,
        burst: int | None,
        overdraft: int,
        calendar: bool,
        rolling: bool,
        spec: dict[str, Any],
        unit: Unit | None,
        unlimited: bool,
    ) -> None:
        """Combinations of extensions that have no meaning are errors, not no-ops."""
        if unlimited:
            return
        if burst is not None and algorithm not in BURST_ALGORITHMS:
            raise self.fail(
                f"'{path}': burst applies to {', '.join(BURST_ALGORITHMS)}, not {algorithm}"
            )
        if overdraft and algorithm != "fixed_window":
            raise self.fail(f"'{path}': overdraft applies to fixed_window only")
        if calendar and algorithm != "fixed_window":
            raise self.fail(f"'{path}': calendar applies to fixed_window only")
        if spec.get("timezone") is not None and not calendar:
            raise self.fail(f"'{path}': timezone needs calendar: true")
        if rolling:
            # A rolling window has its own start per key: no calendar bounds to align to, no
            # next window to owe overdraft debt to, no window for the other algorithms.
            where = "window"
            if algorithm != "fixed_window":
                why = f"applies to fixed_window only, not {algorithm}"
            elif calendar:
                why, where = "cannot be combined with calendar: true", "calendar"
            elif overdraft:
                why, where = "cannot be combined with overdraft", "overdraft"
            else:
                return
            raise self.fail(f"'{path}': window {WINDOW_ROLLING} {why}", where)


def distinct_metric_keys(limits: list[Limit], path: str) -> None:
    """Several limits on one node (`rate_limits:`) must not share one metric series: each gets
    `path.<name>`, or `path.<N><unit>[_<algorithm>]` (`d.user.1second`, `d.user.1day`).
    Limits are frozen: the list's items are replaced."""
    seen: set[str] = set()
    for i, lim in enumerate(limits):
        suffix = lim.name or f"{lim.unit_multiplier}{lim.unit.name.lower()}"
        if not lim.name and lim.algorithm != "fixed_window":
            suffix += f"_{lim.algorithm}"
        if lim.calendar and not lim.name:
            suffix += "_calendar"
        if lim.rolling and not lim.name:
            suffix += "_rolling"
        if suffix in seen:
            suffix += f"_{lim.index}"
        seen.add(suffix)
        limits[i] = dataclasses.replace(lim, full_key=f"{path}.{suffix}")
