"""Streaming a traffic log into requests: one line at a time, gzip or plain, never all at once.

Two line formats, told apart per line:
- rls's decision log (rls/engine/decision_log.py): `{"ts":<ms>,"code":"OK",...}`, told by
  `ts` then `code` as its first two members and a request at its top level (an access log
  line may start with `ts`, even `ts` then `code`, its request in a member). The part
  after the timestamp and code repeats for every call of a caller, so it is parsed once and
  remembered (bounded): most lines cost no JSON parse at all;
- any other JSON object: an Envoy access log line. Its rate-limit request is the object itself
  or any of its members holding `domain` and `descriptors` (rls's `--dynamic-metadata`,
  logged with `%DYNAMIC_METADATA(envoy.filters.http.ratelimit)%`); its time is `ts` (ms),
  `start_time` (RFC 3339, or seconds since the epoch) or `timestamp`.
Descriptor entries are `[key, value]` pairs or `"key=value"` strings; hits come from `hits` /
`hitsAddend` (request and descriptor). A line that cannot be read is counted by reason, with
the first line numbers, and skipped: never fatal.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any

from rls.engine.decision import DescriptorIn
from rls.engine.top import descriptor_text

SHAPES_MAX = 200_000  # distinct request shapes remembered (cleared when full)
MAX_LINE = 1 << 20  # longer lines are bad lines (and are not kept)
MAX_TS_MS = 253402300799999  # the last ms of year 9999: what the report's RFC 3339 can show
EXAMPLES = 5  # line numbers kept per bad-line reason


class Shape:
    """One distinct request (domain, descriptors, hits), shared by every line that repeats it.

    `plans` is the engines' own memo of what they derived from it (engines.py)."""

    __slots__ = ("descriptors", "domain", "hits", "plans", "texts")

    def __init__(
        self, domain: str, descriptors: tuple[DescriptorIn, ...], hits: int,
        texts: tuple[str, ...] | None = None,
    ) -> None:
        self.domain = domain
        self.descriptors = descriptors
        self.hits = hits
        self.texts = texts or tuple(descriptor_text(d.entries) for d in descriptors)
        self.plans: list[Any] = [None, None]


class BadLine(ValueError):
    """A line that cannot be replayed; the message is its reason (counted, not fatal)."""


@dataclass
class BadLines:
    total: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[int]] = field(default_factory=dict)

    def add(self, reason: str, line_no: int) -> None:
        self.total += 1
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
        seen = self.examples.setdefault(reason, [])
        if len(seen) < EXAMPLES:
            seen.append(line_no)


def open_log(path: str) -> IO[bytes]:
    """The file, transparently gunzipped when it starts with gzip's magic bytes."""
    raw = open(path, "rb")
    if raw.peek(2)[:2] == b"\x1f\x8b":
        return gzip.open(raw, "rb")  # type: ignore[return-value]
    return raw


class LogReader:
    """Iterates (timestamp ms, live code or None, Shape) over a log; bad lines in `bad`."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.bad = BadLines()
        self.lines = 0
        self.skipped = 0  # lines without rate-limit data (a request Envoy did not check)
        self._shapes: dict[bytes, Shape] = {}
        self._lines: dict[bytes, tuple[str | None, Shape]] = {}
        self._pieces: dict[str, tuple[DescriptorIn, str]] = {}  # one descriptor's JSON text
        self._heads: dict[str, dict[str, Any]] = {}  # domain and hits

    def _decision_line(self, raw: bytes, comma: int) -> tuple[str | None, Shape] | None:
        """(code, request) of a decision log line not seen before (None: no request at its top
        level, so not rls's decision log after all: a line of one's own format that starts with
        `ts` and `code` too); remembered by the line's text after its timestamp, its request by
        the text after its code, so lines with either code share one Shape."""
        code = None
        rest = comma + 1
        if raw.startswith(b'"code":"', rest):
            end = raw.index(b'"', rest + 8)
            code = {b"OK": "OK", b"OVER_LIMIT": "OVER_LIMIT"}.get(raw[rest + 8:end])
            rest = end + 2
        key = raw[rest:].rstrip()
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._new_shape(key.decode())
            if shape is None:
                return None
            if len(self._shapes) >= SHAPES_MAX or len(self._lines) >= 2 * SHAPES_MAX:
                self._shapes.clear()
                self._lines.clear()
                self._pieces.clear()
                self._heads.clear()
            self._shapes[key] = shape
        seen = self._lines[raw[comma:]] = (code, shape)
        return seen

    def _new_shape(self, key: str) -> Shape | None:
        """The request of a decision log line's remainder `key`. Callers repeat descriptors in
        many combinations (user x path x address), so each descriptor's text is parsed once:
        the line is cut at `},{"entries":`, which cannot occur inside a JSON string without a
        backslash (any line with one is parsed whole)."""
        head, sep, body = key.partition('"descriptors":[{"entries":')
        if not sep or "\\" in key or not body.endswith("}]}"):
            return _shape(_json("{" + key))
        request = self._heads.get(head)
        if request is None:
            request = self._heads[head] = _json("{" + head + '"descriptors":[]}')
        pieces = self._pieces
        descs = []
        texts = []
        for piece in body[:-3].split('},{"entries":'):
            found = pieces.get(piece)
            if found is None:
                one = [_json('{"entries":' + piece + "}")]
                parsed = _shape({"domain": "-", "descriptors": one})
                assert parsed is not None
                found = pieces[piece] = (parsed.descriptors[0], parsed.texts[0])
            descs.append(found[0])
            texts.append(found[1])
        domain = request.get("domain")
        if not isinstance(domain, str) or not domain:
            raise BadLine("no domain")
        return Shape(domain, tuple(descs), _count(request.get("hits", 0)), tuple(texts))

    def __iter__(self) -> Iterator[tuple[int, str | None, Shape]]:
        lines = self._lines
        n = 0
        for raw in self.stream:
            n += 1
            try:
                comma = raw.find(b",", 6) if raw.startswith(b'{"ts":') else -1
                if comma > 0 and raw.startswith(b'"code":"', comma + 1) and len(raw) <= MAX_LINE:
                    # rls's decision log (`ts` then `code`): the parse is memoised. An access
                    # log line may start with `ts` (and `code`) too; it takes the general path.
                    ts = int(raw[6:comma])
                    if not 0 <= ts <= MAX_TS_MS:
                        raise BadLine("timestamp out of range")
                    seen = lines.get(raw[comma:])  # the line but its time: (code, request)
                    if seen is None:
                        seen = self._decision_line(raw, comma)
                    if seen is not None:
                        yield ts, seen[0], seen[1]
                        continue
                if len(raw) > MAX_LINE:
                    self.bad.add("line too long", n)
                    continue
                line = raw.decode()
                if not line.strip():
                    continue
                found = _envoy(_json(line))
                if found is None:
                    self.skipped += 1
                    continue
                yield found
            except BadLine as exc:
                self.bad.add(str(exc), n)
            except UnicodeDecodeError:
                self.bad.add("not UTF-8", n)
            except (ValueError, IndexError):
                self.bad.add("bad decision log line", n)
        self.lines = n


def _json(text: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except ValueError:
        raise BadLine("not JSON (or cut short)") from None
    except RecursionError:  # `[[[[…` within MAX_LINE
        raise BadLine("JSON nested too deep") from None
    if not isinstance(obj, dict):
        raise BadLine("not a JSON object")
    return obj


def _envoy(obj: dict[str, Any]) -> tuple[int, str | None, Shape] | None:
    """An access log line: its time, the code rls answered, its request (None: no rate-limit
    data on this line)."""
    request = obj if "descriptors" in obj else next(
        (v for v in obj.values() if isinstance(v, dict) and "descriptors" in v), None
    )
    if request is None:
        return None
    shape = _shape(request)
    if shape is None:
        return None
    ts = _timestamp(obj if "descriptors" not in obj or "ts" in obj else request)
    code = request.get("overallCode", request.get("code"))
    return ts, code if isinstance(code, str) else None, shape


def _timestamp(obj: dict[str, Any]) -> int:
    """The line's time in ms; a time that is no number (1e400 parses as inf) or past year
    9999 is a bad line, not a traceback that ends the replay."""
    ts = _raw_timestamp(obj)
    if not 0 <= ts <= MAX_TS_MS:
        raise BadLine("timestamp out of range")
    return ts


def _raw_timestamp(obj: dict[str, Any]) -> int:
    for name in ("ts", "start_time", "timestamp", "time"):
        value = obj.get(name)
        if value is None:
            continue
        if name == "ts" and isinstance(value, int):
            return value
        if isinstance(value, (int, float)) or (
            isinstance(value, str) and value.replace(".", "", 1).isdigit()
        ):
            seconds = float(value)
            if not math.isfinite(seconds):
                raise BadLine(f"unreadable {name}")
            return round(seconds * 1000)  # seconds since the epoch
        if isinstance(value, str):
            try:
                return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
                           * 1000)
            except ValueError:
                raise BadLine(f"unreadable {name}") from None
        raise BadLine(f"unreadable {name}")
    raise BadLine("no timestamp (ts, start_time, timestamp)")


def _shape(request: dict[str, Any]) -> Shape | None:
    domain = request.get("domain")
    descs = request.get("descriptors")
    if domain is None and descs is None:
        return None
    if not isinstance(domain, str) or not domain:
        raise BadLine("no domain")
    if not isinstance(descs, list):
        raise BadLine("descriptors is not a list")
    if not descs:
        return None  # Envoy sent nothing to limit
    out = []
    for d in descs:
        entries = d.get("entries") if isinstance(d, dict) else d
        if not isinstance(entries, list) or not entries:
            raise BadLine("a descriptor without entries")
        pairs = tuple(_entry(e) for e in entries)
        hits = d.get("hits", d.get("hitsAddend")) if isinstance(d, dict) else None
        negative = bool(d.get("negative")) if isinstance(d, dict) else False
        out.append(DescriptorIn(pairs, _count(hits) if hits is not None else None, negative))
    return Shape(domain, tuple(out), _count(request.get("hits", request.get("hitsAddend", 0))))


def _entry(entry: Any) -> tuple[str, str]:
    if isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry):
        return entry[0], entry[1]
    if isinstance(entry, str) and "=" in entry:
        key, _, value = entry.partition("=")
        return key, value
    raise BadLine("an entry that is neither [key, value] nor \"key=value\"")


def _count(value: Any) -> int:
    """A hits count: a non-negative integer (Envoy's metadata carries numbers as floats)."""
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadLine("hits is not a non-negative integer")
    return value
