"""The request limits are configurable and honoured (`--max-descriptors`, `--max-entries`,
`--max-value-bytes`, `--max-request-bytes`), and two known defects found by the fuzzer.

One server per module, started with small limits: 3 descriptors, 2 entries, 16-character keys
and values, 2048-byte requests. A request is accepted exactly when it is within all of them;
a rejected one is INVALID_ARGUMENT naming the limit and charges nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from conftest import RlsProcess
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .wire import METHOD, call, counter_used, descriptor, expect, ld, request, vi

CONFIG = """
domain: lim
descriptors:
  - key: guard
    rate_limit: {unit: year, requests_per_unit: 1000000}
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1000000}
"""
MAX_DESCRIPTORS, MAX_ENTRIES, MAX_VALUE, MAX_REQUEST = 3, 2, 16, 2048
GUARD = [("guard", "g")]
GUARD_DESCRIPTOR = descriptor([(b"guard", b"g")], hits=1)


@pytest.fixture(scope="module")
def server(rls_module) -> RlsProcess:
    return rls_module(CONFIG, args=(
        "--max-descriptors", str(MAX_DESCRIPTORS), "--max-entries", str(MAX_ENTRIES),
        "--max-value-bytes", str(MAX_VALUE), "--max-request-bytes", str(MAX_REQUEST),
    ))


@pytest.fixture(scope="module")
def raw(server: RlsProcess) -> Iterator[grpc.UnaryUnaryMultiCallable]:
    channel = grpc.insecure_channel(server.grpc_addr)
    yield channel.unary_unary(METHOD)
    channel.close()


def guard_used(server: RlsProcess) -> int:
    return counter_used(server.http_url, "lim", GUARD)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=st.lists(  # per extra descriptor: (entries, key length, value length)
        st.tuples(st.integers(1, MAX_ENTRIES + 2), st.integers(1, MAX_VALUE + 3),
                  st.integers(0, MAX_VALUE + 3)),
        min_size=0, max_size=MAX_DESCRIPTORS + 1,
    )
)
def test_limits_are_honoured_exactly(server, raw, shape):
    descs = [GUARD_DESCRIPTOR]
    for n, key_len, value_len in shape:
        key = ("k" + "x" * (key_len - 1)).encode()
        descs.append(descriptor([(key, b"v" * value_len)] * n))
    data = request(b"lim", descs)
    violations = []
    if len(descs) > MAX_DESCRIPTORS:
        violations.append("too many descriptors")
    if any(n > MAX_ENTRIES for n, _, _ in shape):
        violations.append("too many entries")
    if any(k > MAX_VALUE for _, k, _ in shape):  # a long value is decided (by a stand-in)
        violations.append("key longer than")
    assert len(data) <= MAX_REQUEST
    before = guard_used(server)
    outcome = call(raw, data)
    if violations:
        assert outcome.code == grpc.StatusCode.INVALID_ARGUMENT, (violations, outcome)
        assert any(v in outcome.details for v in violations), (violations, outcome.details)
        assert guard_used(server) == before, "a rejected request charged the guard"
    else:
        assert outcome.response is not None, (shape, outcome)
        assert guard_used(server) == before + 1


def test_request_at_the_size_limit_is_accepted(server, raw):
    base = request(b"lim", [GUARD_DESCRIPTOR])
    # Padded with an unknown field (ignored by the parser, counted in the size).
    data = next(d for n in range(MAX_REQUEST, 0, -1)
                if len(d := base + ld(15, b"p" * n)) == MAX_REQUEST)
    outcome = call(raw, data)
    assert outcome.response is not None, outcome


def test_request_over_the_size_limit_is_invalid_argument(server, raw):
    before = guard_used(server)
    data = request(b"lim", [GUARD_DESCRIPTOR]) + ld(15, b"p" * MAX_REQUEST)
    outcome = call(raw, data)
    assert guard_used(server) == before
    expect(outcome.code == grpc.StatusCode.INVALID_ARGUMENT and "too large" in outcome.details,
           f"input {data[:64].hex()}… ({len(data)} bytes): expected INVALID_ARGUMENT "
           f"'request of N bytes is too large', got {outcome!r}")


HUGE_MULTIPLIER = [
    # (unit, unit_multiplier): window longer than int64 seconds
    (1, 2**64 - 1),  # SECOND
    (6, 2**40),  # YEAR
]


@pytest.mark.parametrize(("unit", "multiplier"), HUGE_MULTIPLIER)
def test_huge_unit_multiplier_override(server, raw, unit, multiplier):
    override = ld(2, vi(1, 5) + vi(2, unit) + vi(3, multiplier))
    data = request(b"lim", [ld(1, ld(1, b"k") + ld(2, b"x")) + override])
    outcome = call(raw, data)
    expect(outcome.code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT),
           f"input {data.hex()}: expected OK or INVALID_ARGUMENT, got {outcome!r}")
