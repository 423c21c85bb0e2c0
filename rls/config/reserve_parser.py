"""A limit's `reserve:` spec (docs/token-budgets.md) into a Reserve.

Apart from the limit parser because it is a small map of its own whose fields are checked
together: two entry keys that must differ, an optional estimate, an expiry with a unit.
"""

from __future__ import annotations

import re
from typing import Any

from rls.config.errors import ConfigError
from rls.config.yaml_source import as_str, as_uint
from rls.core.limits import RESERVE_EXPIRY_DEFAULT_S, RESERVE_EXPIRY_MAX_S, Reserve

RESERVE_FIELDS = ("estimate", "id_key", "settle_key", "expire_after")
# Quota mode's dealing and `reserve` both need a charge and its release to be exact inverses
# within a window: the same algorithms qualify (rls.quota.share.SUPPORTED_ALGORITHMS).
_DURATION = re.compile(r"(\d+)(ms|s|m|h)?")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, None: 1000}


def parse_reserve(file: str, spec: Any, path: str) -> Reserve:
    """`reserve:` of the limit at `path`; ConfigError (field `reserve`, so that it points at
    the `reserve:` line) when it is wrong."""
    try:
        return _reserve(file, spec, path)
    except ConfigError as exc:
        exc.field = "reserve"
        raise


def _reserve(file: str, spec: Any, path: str) -> Reserve:

    def fail(message: str) -> ConfigError:
        return ConfigError(file, f"'{path}': reserve: {message}", field="reserve")

    if not isinstance(spec, dict):
        raise fail("must be a map (id_key, settle_key, estimate, expire_after)")
    for key in spec:
        if key not in RESERVE_FIELDS:
            raise fail(f"unknown field '{key}' (one of {', '.join(RESERVE_FIELDS)})")
    id_key = as_str(file, spec.get("id_key"), "id_key")
    settle_key = as_str(file, spec.get("settle_key"), "settle_key")
    if not id_key or not settle_key:
        raise fail("needs id_key (the entry carrying the request id) and settle_key (the "
                   "entry only the stream-done call sends)")
    if id_key == settle_key:
        raise fail(f"id_key and settle_key must differ (both '{id_key}')")
    estimate = int(as_uint(file, spec.get("estimate"), "estimate"))  # a plain int, not YAML's
    given = spec.get("expire_after")
    expire_ms = RESERVE_EXPIRY_DEFAULT_S * 1000
    if given is not None:
        found = _DURATION.fullmatch(str(given).strip()) if not isinstance(given, bool) else None
        if found is None:
            raise fail(f"expire_after '{given}' is not a duration (e.g. 600s, 10m, 1h)")
        expire_ms = int(found.group(1)) * _UNIT_MS[found.group(2)]
        if not 1000 <= expire_ms <= RESERVE_EXPIRY_MAX_S * 1000:
            raise fail(f"expire_after must be between 1s and {RESERVE_EXPIRY_MAX_S}s")
    return Reserve(id_key, settle_key, estimate, expire_ms)
