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
