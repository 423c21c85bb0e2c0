"""Protobuf <-> limiter values, with the request validation (docs/reliability.md, "Bad input
limits").

Kept apart from the servicer so the admin `/json` endpoint runs the exact same checks.
"""

from __future__ import annotations

from typing import Any

from envoy.service.ratelimit.v3 import rls_pb2
from google.protobuf import unknown_fields

from rls.config.model import MAX_WINDOW_SECONDS, UNIT_SECONDS, Unit
from rls.core.keys import long_value_stand_in
from rls.engine.limiter import OK, Decision, DescriptorIn, InvalidRequest
from rls.memo import RESPONSE_SHAPE_BYTES, RESPONSE_SHAPE_ENTRIES, BoundedCache
from rls.settings import Settings

MAX_HITS = 1_000_000_000_000
_NEGATIVE_ON_WIRE = b"\x20\x01"
_OVERRIDE_UNITS = frozenset(u for u in Unit if u is not Unit.UNKNOWN)
IS_NEGATIVE_HITS = 4  # RateLimitDescriptor.is_negative_hits, absent from xds-protos 1.85
UNIT_MULTIPLIER = 3  # RateLimitDescriptor.RateLimitOverride.unit_multiplier, likewise


def _too_long(text: str, max_bytes: int) -> bool:
    """UTF-8 length above max_bytes; encodes only when the character count can't tell."""
    n = len(text)
    if n * 4 <= max_bytes:
        return False
    return n > max_bytes or len(text.encode()) > max_bytes


def _pairs(i: int, entries: Any, max_len: int) -> tuple[tuple[str, str], ...]:
    """Descriptor `i`'s entries as (key, value) pairs: an empty or over-long key is refused
    (keys come from Envoy's config, not from callers); an over-long value is decided by its
    stand-in (rls/core/keys.py)."""
    pairs = []
    for entry in entries:
        key, value = entry.key, entry.value
        if not key:
            raise InvalidRequest(f"descriptor {i}: entry key must not be empty")
        if _too_long(key, max_len):
            raise InvalidRequest(f"descriptor {i}: entry key longer than {max_len} bytes")
        if _too_long(value, max_len):
            value = long_value_stand_in(value, max_len)
        pairs.append((key, value))
    return tuple(pairs)


def _unknown_varint(message: object, number: int) -> int | None:
    for field in unknown_fields.UnknownFieldSet(message):
        if field.field_number == number and field.wire_type == 0:
            return int(field.data)
    return None


def to_descriptors(
    request: rls_pb2.RateLimitRequest, settings: Settings, raw: bytes | None = None
) -> list[DescriptorIn]:
    """Validate and convert; raises InvalidRequest with a message naming the problem.

    `raw` (the request's wire bytes) lets the unknown-field parse for is_negative_hits be
    skipped when its encoding (tag 0x20, value 0x01) appears nowhere in the message.
    """
    maybe_negative = raw is None or _NEGATIVE_ON_WIRE in raw
    if not request.domain:
        raise InvalidRequest("rate limit domain must not be empty")
    descriptors = request.descriptors
    if not descriptors:
        raise InvalidRequest("rate limit descriptor list must not be empty")
    if len(descriptors) > settings.max_descriptors:
        raise InvalidRequest(
            f"too many descriptors: {len(descriptors)} > {settings.max_descriptors}"
        )
    max_len = settings.max_value_bytes
    if _too_long(request.domain, max_len):
        raise InvalidRequest(f"domain longer than {max_len} bytes")
    out: list[DescriptorIn] = []
    for i, desc in enumerate(descriptors):
        entries = desc.entries
        if len(entries) > settings.max_entries:
            raise InvalidRequest(
                f"descriptor {i}: too many entries: {len(entries)} > {settings.max_entries}"
            )
        pairs = _pairs(i, entries, max_len)
        hits = None
        if desc.HasField("hits_addend"):
            hits = desc.hits_addend.value
            if hits > MAX_HITS:
                raise InvalidRequest(f"descriptor {i}: hits_addend {hits} is too large")
        override = None
        if desc.HasField("limit"):
            lim = desc.limit
            multiplier = _unknown_varint(lim, UNIT_MULTIPLIER) or 1
            override = (lim.requests_per_unit, int(lim.unit), multiplier)
            if lim.unit not in _OVERRIDE_UNITS:
                raise InvalidRequest(
                    f"descriptor {i}: limit override has an invalid unit {int(lim.unit)}"
                )
            if UNIT_SECONDS[Unit(lim.unit)] * multiplier > MAX_WINDOW_SECONDS:
                raise InvalidRequest(
                    f"descriptor {i}: limit override window longer than 100 years"
                )
        negative = maybe_negative and bool(_unknown_varint(desc, IS_NEGATIVE_HITS))
        out.append(DescriptorIn(pairs, hits, negative, override))
    if request.hits_addend > MAX_HITS:
        raise InvalidRequest(f"hits_addend {request.hits_addend} is too large")
    return out


_MULTIPLIER_BYTES: dict[int, bytes] = {}


def _unit_multiplier_field(multiplier: int) -> bytes:
    """RateLimitResponse.RateLimit.unit_multiplier (field 4, varint) as raw bytes.

    xds-protos 1.85 lacks the field; merged as an unknown field it is still serialised, so
    Envoy 1.40 sees the real window (x-ratelimit-limit `w=`).
    """
    raw = _MULTIPLIER_BYTES.get(multiplier)
    if raw is None:
        out = bytearray([0x20])
        value = multiplier
        while value > 0x7F:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
        raw = bytes(out)
        if len(_MULTIPLIER_BYTES) < 256:  # request-controlled: keep only a few
            _MULTIPLIER_BYTES[multiplier] = raw
    return raw


def to_response(decision: Decision) -> rls_pb2.RateLimitResponse:
    response = rls_pb2.RateLimitResponse(overall_code=decision.overall)
    add = response.statuses.add
    for st in decision.statuses:
        status = add(code=st.code, limit_remaining=st.remaining)
        limit = st.limit
        if limit is not None:
            cur = status.current_limit
            cur.requests_per_unit = limit.requests_per_unit
            cur.unit = limit.unit
            if limit.name:
                cur.name = limit.name
            if limit.unit_multiplier > 1:
                cur.MergeFromString(_unit_multiplier_field(limit.unit_multiplier))
            reset_ms = st.reset_ms  # Status.reset_seconds, inline: once per status per call
            status.duration_until_reset.seconds = -(-reset_ms // 1000) if reset_ms else 0
        elif st.code != OK:
            status.code = st.code
    return response


# Estimated memory of a kept answer message (upb) per byte of its wire form, plus a floor.
SHAPE_BYTES_PER_WIRE_BYTE = 8
SHAPE_OVERHEAD = 1024


class ResponseShapes:
    """A decision's answer as wire bytes, from a message kept per response shape.

    Why: building the RateLimitResponse message is most of an answer's cost (about 3 µs of
    Python for three statuses, against 0.8 µs to set two fields per status of a built one and
    serialise it), and call after call the same request gets an answer of the same shape: the
    overall code, and per status its code and the limit it reports. Only `limit_remaining`
    and `duration_until_reset` change. So the first answer of a shape is built by
    `to_response` and its message kept; later ones set those two fields and serialise it,
    byte for byte what `to_response` gives (tests/services/test_response_shapes.py).

    The kept message is shared by every call of its shape: it is set and serialised with no
    await between, on the event loop's one thread. An entry holds its limits, so the ids in
    its key stay theirs; a reload's new limits make new shapes, and the old ones age out of
    the bounded cache (`response_shape` in rls.memo). Not for answers with response extras
    (headers, JSON body, dynamic metadata): those are decorated per call.
    """

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache = BoundedCache(
            "response_shape", RESPONSE_SHAPE_ENTRIES, RESPONSE_SHAPE_BYTES
        )

    def serialize(self, decision: Decision) -> bytes:
        statuses = decision.statuses
        key = (decision.overall, *[(st.code, id(st.limit)) for st in statuses])
        kept = self._cache.get(key)
        if kept is None:
            return self._first(key, decision)
        message, fields = kept[0], kept[1]
        for (status, duration), st in zip(fields, statuses, strict=True):
            status.limit_remaining = st.remaining
            if duration is not None:
                reset_ms = st.reset_ms
                duration.seconds = -(-reset_ms // 1000) if reset_ms else 0
        answer: bytes = message.SerializeToString()
        return answer

    def _first(self, key: tuple[Any, ...], decision: Decision) -> bytes:
        message = to_response(decision)
        answer: bytes = message.SerializeToString()
        fields = [
            (status, status.duration_until_reset if st.limit is not None else None)
            for status, st in zip(message.statuses, decision.statuses, strict=True)
        ]
        limits = tuple(st.limit for st in decision.statuses)  # keeps the key's ids theirs
        cost = SHAPE_BYTES_PER_WIRE_BYTE * len(answer) + SHAPE_OVERHEAD
        self._cache.put(key, (message, fields, limits), cost)
        return answer
