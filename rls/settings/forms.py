"""The written forms of setting values: booleans (`on`, `true`, `1`…), Go durations and
`k1:v1,k2:v2` lists (as the reference writes its variables).

No rls import: Settings validates with them, the command line and the `ratelimit` entry read
flags and variables with them, and the xDS client (rls.config.xds) its lists.
"""

from __future__ import annotations

import re

_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_bool(text: str) -> bool:
    """on/off, true/false, yes/no, 1/0 (any case; empty is off); ValueError otherwise."""
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def parse_duration(text: str) -> float:
    """Seconds from `10s`, `1m30s`, `500ms`, `1.5h` (Go's time.ParseDuration) or a plain number
    of seconds; ValueError otherwise."""
    raw = text.strip()
    try:
        return float(raw)
    except ValueError:
        pass
    body = raw.removeprefix("+")
    parts = _GO_PART.findall(body)
    if not parts or "".join(n + u for n, u in parts) != body:
        raise ValueError(f"{text!r} is not a duration (e.g. 10s, 1m30s, 500ms)")
    return sum(float(number) * _GO_UNITS[unit] for number, unit in parts)


def parse_pairs(text: str, separators: str = ":") -> dict[str, str]:
    """`k1:v1,k2:v2` as a dict; each entry is split at its first character in `separators`
    (node metadata takes `k=v` too, as the reference's parser does). Empty entries are
    skipped; an entry without a separator or with an empty key is a ValueError naming it."""
    pairs: dict[str, str] = {}
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            continue
        cut = min((i for i in (entry.find(s) for s in separators) if i >= 0), default=-1)
        if cut <= 0:
            shown = " or ".join(f"key{s}value" for s in separators)
            raise ValueError(f"entry {entry!r} is not {shown}")
        pairs[entry[:cut].strip()] = entry[cut + 1 :].strip()
    return pairs


# Names grpc-go (the reference's client) never sends from user metadata (isReservedHeader):
# the transport sets them. `grpc-timeout` among them would otherwise end every stream.
RESERVED_HEADERS = frozenset({"content-type", "user-agent", "te"})
_METADATA_KEY = re.compile(r"[0-9a-z_.-]+")


def stream_headers(text: str) -> tuple[tuple[tuple[str, str | bytes], ...], list[str]]:
    """CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS (`k1:v1,k2:v2`) as gRPC metadata, and the
    reserved keys left out (`grpc-*`, content-type, user-agent, te), as grpc-go leaves them.
    Keys are lower-cased (gRPC's rule); a `-bin` key's value is sent as bytes (gRPC
    base64-encodes it). A key or value gRPC would refuse at every connect — the stream never
    opening, grpc-core logging it each retry — is a ValueError naming it, for start-up."""
    headers: list[tuple[str, str | bytes]] = []
    dropped: list[str] = []
    for raw_key, value in parse_pairs(text).items():
        key = raw_key.lower()
        if not _METADATA_KEY.fullmatch(key):
            raise ValueError(f"header name {raw_key!r} is not a gRPC metadata key "
                             "(letters, digits, '-', '_', '.')")
        if key.startswith("grpc-") or key in RESERVED_HEADERS:
            dropped.append(key)
        elif key.endswith("-bin"):
            headers.append((key, value.encode()))
        elif not all(" " <= c <= "~" for c in value):
            raise ValueError(f"the value of {raw_key!r} is not printable ASCII")
        else:
            headers.append((key, value))
    return tuple(headers), dropped
