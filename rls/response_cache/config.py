"""Cache rules YAML (`--cache-config`): schema, defaults and validation.

Every bad value is a `ConfigError(file, message)` whose text is `file: message`, like the
descriptor files, so `rls check-config` prints cache files the same way. The file is either a
list of rules or a mapping with `rules:` plus process-wide options (see `TOP_LEVEL`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from rls.config.errors import ConfigError
from rls.config.loader import is_cache_doc, read_text  # the loader's budgets and rule
from rls.config.yaml_source import parse_yaml
from rls.stores.redis.urls import redact, url_problem

API_ATTRIBUTE = "xds.route_metadata.filter_metadata['gateway']['api']"
DAY = 86400
DEFAULT_TTL = 7 * DAY
MAX_TTL = 10 * 365 * DAY
DEFAULT_MAX_ENTRY = 1024 * 1024
MAX_ENTRY_LIMIT = 64 * 1024 * 1024  # far above sane Envoy buffers; SSDB caps a request at 128 MiB
DEFAULT_MEMORY_BYTES = 64 * 1024 * 1024
DEFAULT_QUEUE_BYTES = 64 * 1024 * 1024
MAX_BUDGET = 64 * 1024**3
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

_API_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # bounded: it is part of every store key
_HEADER_RE = re.compile(r"^:?[a-z0-9!#$%&'*+.^_`|~-]{1,128}$")
_DURATION_RE = re.compile(r"^\s*(\d+)\s*(s|m|h|d|w)?\s*$")
_SIZE_RE = re.compile(r"^\s*(\d+)\s*(b|kb|kib|mb|mib|gb|gib)?\s*$", re.IGNORECASE)
_UNIT_SECONDS = {None: 1, "s": 1, "m": 60, "h": 3600, "d": DAY, "w": 7 * DAY}
_SIZE_UNITS = {
    None: 1, "b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2, "gb": 1000**3,
    "gib": 1024**3,
}

TOP_LEVEL = frozenset(
    {
        "rules",
        "store",
        "key_prefix",
        "api_attribute",
        "store_timeout_ms",
        "coalesce_wait_ms",
        "version_cache_ms",
        "memory_max_bytes",
        "writer_workers",
        "write_queue_size",
        "write_queue_bytes",
        "write_drain_ms",
    }
)
RULE_KEYS = frozenset(
    {
        "api",
        "match",
        "methods",
        "key",
        "ttl",
        "max_entry_bytes",
        "statuses",
        "vary",
        "unknown_length",
        "key_fields",
        "hits_from",
        "max_json_bytes",
    }
)
MATCH_KEYS = frozenset({"header", "attribute", "value"})
KEY_KEYS = frozenset({"api", "path", "extra_key_header", "headers", "query", "body"})
DEFAULT_MAX_JSON = 64 * 1024  # the example gateway's buffer filter max_request_bytes
MAX_KEY_FIELDS = 32
_MEMBER_MAX = 256  # bytes of one JSON member name in key_fields / hits_from
HITS_FROM_PREFIX = "json:"


@dataclass(frozen=True, slots=True)
class KeySpec:
    """Which parts of a request form the cache key (method and API name always do)."""

    path: bool = True
    extra_key_header: str | None = None
    headers: tuple[str, ...] = ()
    query: bool = False
    body: bool = False
    # `key_fields`: these top-level members of a JSON body, in this order, instead of the body
    fields: tuple[str, ...] = ()

    @property
    def needs_body(self) -> bool:
        return self.body or bool(self.fields)


@dataclass(frozen=True, slots=True)
class Match:
    """How a request is recognised as this rule's API.

    `kind` is `attribute` (an ext_proc request attribute, by default the route metadata
    `gateway.api`, must equal `value`) or `header` (a request header must be present, and equal
    `value` when one is given).
    """

    kind: str
    name: str
    value: str | None


@dataclass(frozen=True, slots=True)
class CacheRule:
    api: str
    match: Match
    methods: frozenset[str]
    key: KeySpec
    ttl: int  # seconds; whole seconds because SSDB has no sub-second TTLs
    max_entry_bytes: int
    statuses: frozenset[int]
    vary: frozenset[str]
    # A response without Content-Length (chunked) is buffered for storing only when true:
    # Envoy answers 500 when such a body outgrows its stream buffer limit.
    buffer_unknown_length: bool = False
    # `hits_from: json:NAME`: the request's weight for Envoy's ratelimit filter comes from this
    # top-level member of a JSON body (rls/response_cache/jsonbody.py), sent back as dynamic
    # metadata.
    hits_from: str | None = None
    # Largest body parsed as JSON for `key_fields` / `hits_from` (bigger: the documented rule).
    max_json_bytes: int = DEFAULT_MAX_JSON

    @property
    def needs_body(self) -> bool:
        """Whether the servicer must ask Envoy for the request body."""
        return self.key.needs_body or self.hits_from is not None


@dataclass(frozen=True, slots=True)
class CacheConfig:
    rules: tuple[CacheRule, ...] = ()
    store: str | None = None
    key_prefix: str = "rc:"
    api_attribute: str = API_ATTRIBUTE
    store_timeout_ms: int = 50
    coalesce_wait_ms: int = 100
    version_cache_ms: int = 1000
    # memory:// store: LRU budget in bytes (keys + values + per-entry overhead)
    memory_max_bytes: int = DEFAULT_MEMORY_BYTES
    # Background writer (rls/response_cache/writer.py): workers, queue bounds, drain deadline
    # at shutdown
    writer_workers: int = 4
    write_queue_size: int = 1000
    write_queue_bytes: int = DEFAULT_QUEUE_BYTES
    write_drain_ms: int = 2000
    file: str = "<memory>"
    apis: frozenset[str] = field(default=frozenset())

    def attributes(self) -> set[str]:
        """Request attributes the Envoy filter must send for these rules to match."""
        return {r.match.name for r in self.rules if r.match.kind == "attribute"}


def load_cache_config(path: str) -> CacheConfig:
    """Read and validate a cache rules file; raises ConfigError (`file: message`)."""
    # Regular files only, at most the loader's size: a FIFO blocked here, /dev/zero never ended.
    try:
        text = read_text(path)
    except ConfigError as exc:
        reason = exc.message.removeprefix("error loading config file: ")
        raise ConfigError(path, f"cannot read cache config: {reason}") from None
    return parse_cache_config(path, text)


def check_cache_file(path: str) -> None:
    """For `rls check-config`: raise ConfigError when the cache file is invalid."""
    load_cache_config(path)


def is_cache_file(path: str) -> bool:
    """Whether `path` looks like a cache rules file rather than a descriptor file.

    For `rls check-config`, which takes both kinds: a cache file is a mapping with `rules` (and
    no `domain`) or a list whose first item is a mapping with `api`. Unreadable or invalid
    YAML is not a cache file (the descriptor loader then reports it).
    """
    try:  # regular files only, size/node/depth budgets: a FIFO or a YAML bomb is just "no"
        return is_cache_doc(parse_yaml(path, read_text(path)))
    except ConfigError:
        return False


def parse_cache_config(file: str, text: str) -> CacheConfig:
    # The descriptor loader's node, alias and depth budgets first (a YAML bomb or `[[[…` was a
    # hang or a RecursionError traceback); its scalars differ, so safe_load builds the rules.
    try:
        parse_yaml(file, text)
    except ConfigError as exc:
        message = exc.message.replace("error loading config file", "error loading cache config")
        raise ConfigError(file, message, line=exc.line, column=exc.column) from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(file, f"error loading cache config: yaml: {where}{problem}") from None
    return build_cache_config(file, doc)


def build_cache_config(file: str, doc: Any) -> CacheConfig:
    def fail(message: str) -> ConfigError:
        return ConfigError(file, message)

    if isinstance(doc, list):
        doc = {"rules": doc}
    if not isinstance(doc, dict):
        raise fail("cache config must be a list of rules or a mapping with 'rules'")
    _no_unknown(file, "cache config", doc, TOP_LEVEL)
    if "rules" not in doc:
        raise fail("cache config needs 'rules' (a list)")
    rules_doc = doc["rules"]
    if rules_doc is None:
        rules_doc = []
    if not isinstance(rules_doc, list):
        raise fail("'rules' must be a list")

    store = doc.get("store")
    if store is not None and (not isinstance(store, str) or "://" not in store):
        raise fail("'store' must be a URL such as redis://host:6379/0 or ssdb://host:8888")
    problem = url_problem(store) if store is not None else None
    if store is not None and problem is not None:
        raise fail(f"'store' {redact(store)!r}: {problem}")
    prefix = doc.get("key_prefix", "rc:")
    if not isinstance(prefix, str) or not prefix or len(prefix.encode()) > 32:
        raise fail("'key_prefix' must be a non-empty string of at most 32 bytes")
    attribute = doc.get("api_attribute", API_ATTRIBUTE)
    if not isinstance(attribute, str) or not attribute.strip():
        raise fail("'api_attribute' must be a non-empty CEL expression")
    timeout = _int(file, "store_timeout_ms", doc.get("store_timeout_ms", 50), 1, 10_000)
    coalesce = _int(file, "coalesce_wait_ms", doc.get("coalesce_wait_ms", 100), 0, 60_000)
    version_ms = _int(file, "version_cache_ms", doc.get("version_cache_ms", 1000), 0, 60_000)
    memory = _size(file, "'memory_max_bytes'", doc.get("memory_max_bytes", DEFAULT_MEMORY_BYTES),
                   MAX_BUDGET, "64GiB")
    workers = _int(file, "writer_workers", doc.get("writer_workers", 4), 1, 64)
    queue_size = _int(file, "write_queue_size", doc.get("write_queue_size", 1000), 1, 1_000_000)
    queue_bytes = _size(file, "'write_queue_bytes'",
                        doc.get("write_queue_bytes", DEFAULT_QUEUE_BYTES), MAX_BUDGET, "64GiB")
    drain_ms = _int(file, "write_drain_ms", doc.get("write_drain_ms", 2000), 0, 60_000)

    rules = tuple(_rule(file, i, r, attribute) for i, r in enumerate(rules_doc))
    return CacheConfig(
        rules=rules,
        store=store,
        key_prefix=prefix,
        api_attribute=attribute,
        store_timeout_ms=timeout,
        coalesce_wait_ms=coalesce,
        version_cache_ms=version_ms,
        memory_max_bytes=memory,
        writer_workers=workers,
        write_queue_size=queue_size,
        write_queue_bytes=queue_bytes,
        write_drain_ms=drain_ms,
        file=file,
        apis=frozenset(r.api for r in rules),
    )


def _rule(file: str, index: int, doc: Any, api_attribute: str) -> CacheRule:
    where = f"rules[{index}]"

    def fail(message: str) -> ConfigError:
        return ConfigError(file, f"{where}: {message}")

    if not isinstance(doc, dict):
        raise fail("a rule must be a mapping")
    _no_unknown(file, where, doc, RULE_KEYS)
    api = doc.get("api")
    if not isinstance(api, str) or not _API_RE.match(api):
        raise fail("'api' is required: 1-64 characters of letters, digits, '_', '.', '-'")
    where = f"rules[{index}] (api {api})"

    match = _match(file, where, doc.get("match"), api, api_attribute)
    methods_doc = doc.get("methods", ["GET", "POST"])
    if not isinstance(methods_doc, list) or not methods_doc:
        raise fail("'methods' must be a non-empty list such as [GET, POST]")
    methods = set()
    for m in methods_doc:
        if not isinstance(m, str) or m.upper() not in KNOWN_METHODS:
            raise fail(f"unknown method {m!r} (one of {', '.join(sorted(KNOWN_METHODS))})")
        methods.add(m.upper())

    ttl = _duration(file, f"{where}: 'ttl'", doc.get("ttl", DEFAULT_TTL))
    max_entry = _size(
        file, f"{where}: 'max_entry_bytes'", doc.get("max_entry_bytes", DEFAULT_MAX_ENTRY)
    )

    statuses_doc = doc.get("statuses", [200])
    if not isinstance(statuses_doc, list) or not statuses_doc:
        raise fail("'statuses' must be a non-empty list of 2xx codes")
    statuses = set()
    for s in statuses_doc:
        if isinstance(s, bool) or not isinstance(s, int) or not 200 <= s <= 299 or s == 206:
            raise fail(f"status {s!r} cannot be cached: only 2xx codes other than 206")
        statuses.add(s)

    vary = frozenset(_header_list(file, f"{where}: 'vary'", doc.get("vary", [])))
    unknown_length = doc.get("unknown_length", "skip")
    if unknown_length not in ("skip", "buffer"):
        raise fail("'unknown_length' must be skip (default) or buffer")
    key, hits_from, max_json = _json_options(file, where, doc, _key(file, where, doc.get("key")))
    return CacheRule(
        api=api,
        match=match,
        methods=frozenset(methods),
        key=key,
        ttl=ttl,
        max_entry_bytes=max_entry,
        statuses=frozenset(statuses),
        vary=vary,
        buffer_unknown_length=unknown_length == "buffer",
        hits_from=hits_from,
        max_json_bytes=max_json,
    )


def _json_options(
    file: str, where: str, doc: dict[Any, Any], key: KeySpec
) -> tuple[KeySpec, str | None, int]:
    """`key_fields` (folded into the key), `hits_from` (the member name) and `max_json_bytes`."""
    if "key_fields" in doc:
        if key.body:
            raise ConfigError(
                file, f"{where}: 'key_fields' keys on members of the body: drop key 'body: true'"
            )
        key = replace(key, fields=_members(file, f"{where}: 'key_fields'", doc["key_fields"]))
    hits_from = doc.get("hits_from")
    if hits_from is not None:
        if not isinstance(hits_from, str) or not hits_from.startswith(HITS_FROM_PREFIX):
            raise ConfigError(file, f"{where}: 'hits_from' must be json:MEMBER "
                                    "(a top-level member of a JSON body)")
        hits_from = _member(file, f"{where}: 'hits_from'",
                            hits_from.removeprefix(HITS_FROM_PREFIX))
    max_json = _size(file, f"{where}: 'max_json_bytes'",
                     doc.get("max_json_bytes", DEFAULT_MAX_JSON))
    return key, hits_from, max_json


def _member(file: str, where: str, name: Any) -> str:
    if not isinstance(name, str) or not name or len(name.encode()) > _MEMBER_MAX:
        raise ConfigError(file, f"{where}: a JSON member name of 1-{_MEMBER_MAX} bytes")
    return name


def _members(file: str, where: str, doc: Any) -> tuple[str, ...]:
    if not isinstance(doc, list) or not 1 <= len(doc) <= MAX_KEY_FIELDS:
        raise ConfigError(
            file, f"{where} must be a list of 1-{MAX_KEY_FIELDS} JSON member names"
        )
    out: list[str] = []
    for name in doc:
        name = _member(file, where, name)
        if name in out:
            raise ConfigError(file, f"{where}: duplicate member {name!r}")
        out.append(name)
    return tuple(out)


def _match(file: str, where: str, doc: Any, api: str, api_attribute: str) -> Match:
    if doc is None:
        return Match("attribute", api_attribute, api)
    if not isinstance(doc, dict):
        raise ConfigError(file, f"{where}: 'match' must be a mapping (header or attribute)")
    _no_unknown(file, f"{where}: match", doc, MATCH_KEYS)
    value = doc.get("value")
    if isinstance(value, bool) or (value is not None and not isinstance(value, (str, int))):
        raise ConfigError(file, f"{where}: match 'value' must be a string")
    value = None if value is None else str(value)
    if ("header" in doc) == ("attribute" in doc):
        raise ConfigError(file, f"{where}: 'match' needs exactly one of 'header' or 'attribute'")
    if "header" in doc:
        name = doc["header"]
        if not isinstance(name, str) or not _HEADER_RE.match(name.lower()):
            raise ConfigError(file, f"{where}: match 'header' must be a header name")
        return Match("header", name.lower(), value)
    name = doc["attribute"]
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(file, f"{where}: match 'attribute' must be a CEL expression")
    if value is None:
        raise ConfigError(file, f"{where}: match by 'attribute' needs a 'value'")
    return Match("attribute", name, value)


def _key(file: str, where: str, doc: Any) -> KeySpec:
    if doc is None:
        return KeySpec()
    if not isinstance(doc, dict):
        raise ConfigError(file, f"{where}: 'key' must be a mapping")
    _no_unknown(file, f"{where}: key", doc, KEY_KEYS)
    if doc.get("api", True) is not True:
        raise ConfigError(
            file, f"{where}: key 'api' cannot be turned off: the API name is the purge namespace"
        )
    flags = {}
    for name in ("path", "query", "body"):
        value = doc.get(name, name == "path")
        if not isinstance(value, bool):
            raise ConfigError(file, f"{where}: key '{name}' must be true or false")
        flags[name] = value
    extra = doc.get("extra_key_header")
    if extra is not None:
        if not isinstance(extra, str) or not _HEADER_RE.match(extra.lower()):
            raise ConfigError(file, f"{where}: key 'extra_key_header' must be a header name")
        extra = extra.lower()
    headers = _header_list(file, f"{where}: key 'headers'", doc.get("headers", []))
    return KeySpec(
        path=flags["path"],
        extra_key_header=extra,
        headers=tuple(headers),
        query=flags["query"],
        body=flags["body"],
    )


def _header_list(file: str, where: str, doc: Any) -> list[str]:
    if not isinstance(doc, list):
        raise ConfigError(file, f"{where} must be a list of header names")
    out: list[str] = []
    for h in doc:
        if not isinstance(h, str) or not _HEADER_RE.match(h.lower()):
            raise ConfigError(file, f"{where}: {h!r} is not a header name")
        if h.lower() in out:
            raise ConfigError(file, f"{where}: duplicate header {h.lower()!r}")
        out.append(h.lower())
    return out


def _no_unknown(file: str, where: str, doc: dict[Any, Any], allowed: frozenset[str]) -> None:
    for k in doc:
        if k not in allowed:
            raise ConfigError(
                file, f"{where}: unknown key {k!r} (allowed: {', '.join(sorted(allowed))})"
            )


def _int(file: str, name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(file, f"'{name}' must be an integer from {low} to {high}")
    return value


def _duration(file: str, where: str, value: Any) -> int:
    """Whole seconds from `604800`, `"7d"`, `"12h"`, `"30m"`, `"45s"`, `"2w"`."""
    seconds: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        seconds = value
    elif isinstance(value, str):
        m = _DURATION_RE.match(value)
        if m:
            seconds = int(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    if seconds is None or not 1 <= seconds <= MAX_TTL:
        raise ConfigError(
            file, f"{where} must be a duration from 1s to 10 years (e.g. 3600, 30m, 12h, 7d)"
        )
    return seconds


def _size(file: str, where: str, value: Any, maximum: int = MAX_ENTRY_LIMIT,
          maximum_text: str = "64MiB") -> int:
    """Bytes from `1048576`, `"512KiB"`, `"1MiB"`, `"1MB"`, `"1GiB"`."""
    size: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            unit = m.group(2).lower() if m.group(2) else None
            size = int(m.group(1)) * _SIZE_UNITS[unit]
    if size is None or not 1 <= size <= maximum:
        raise ConfigError(
            file, f"{where} must be a size from 1 byte to {maximum_text} (e.g. 512KiB, 1MiB)"
        )
    return size
