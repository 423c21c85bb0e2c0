"""Fuzz ShouldRateLimit with raw request bytes (DESIGN §10: bad input is INVALID_ARGUMENT with a
clear message, never a crash, never a charged counter).

Three generators feed one property, against one long-lived `rls serve` (memory backend):
random bytes; mutations of valid requests; and structured requests built field by field on the
wire with huge values, 10,000 entries, 10,000 descriptors, invalid UTF-8, control characters,
key/value separators (`| % # { } _ . :`), empty keys, out-of-range hits, limit overrides with
unknown units, and the unknown `is_negative_hits` field.

Property, per call:
- the answer is a RateLimitResponse (OK / OVER_LIMIT, one status per descriptor) or
  INVALID_ARGUMENT with a message — never UNKNOWN / INTERNAL / anything else, never a hang;
- a rejected call decides and charges nothing: the guard counter (`guard`=`g`, present in the
  mutated requests and in all structured ones but the empty one), the sum of
  `rls_limit_total_hits_total` and the sum of `rls_requests_total` are unchanged;
- structured requests whose validity is known by construction get the matching answer;
- the process stays up, and at the end still answers and logs no unexpected exception.

The server runs with `--max-request-bytes 4194304` so that requests with 10,000 descriptors or
entries reach the validator (`test_request_limits.py` covers the size limit itself).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import grpc
import pytest
from conftest import RlsProcess, http_get
from envoy.service.ratelimit.v3 import rls_pb2
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st

from rls.core.limits import MAX_WINDOW_SECONDS, UNIT_SECONDS, Unit

from .wire import (
    METHOD,
    Outcome,
    call,
    counter_used,
    descriptor,
    metric_sums,
    request,
)

CONFIG = """
domain: fz
usage_stats: {days: 2, calls: ["user"], distinct: [{key: path, per: user}]}
descriptors:
  - key: guard
    rate_limit: {unit: year, requests_per_unit: 4294967295}
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: "a|b"
    value: "x%y#z{w}_.:"
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: sliding_log}
  - key: "a"
    value: "b|x%y#z{w}_.:"
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: user
    descriptors:
      - key: path
        value: "/api/*"
        rate_limit: {unit: second, requests_per_unit: 3, algorithm: token_bucket, burst: 5}
      - key: path
        rate_limits:
          - {unit: second, requests_per_unit: 10}
          - {unit: day, requests_per_unit: 1000, algorithm: gcra}
  - key: conc
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: concurrency}
  - key: win
    value: "*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 7, algorithm: sliding_window}
  - key: free
    rate_limit: {unlimited: true}
"""

DOMAIN = "fz"
GUARD = [("guard", "g")]
# hits_addend 1 of its own, so a request-level hits_addend never fills the guard up.
GUARD_DESCRIPTOR = descriptor([(b"guard", b"g")], hits=1)
MAX_DESCRIPTORS, MAX_ENTRIES, MAX_VALUE, MAX_HITS = 64, 32, 1024, 1_000_000_000_000
SEPARATORS = "|%#{}_.:"
ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT}
WATCHED = ("rls_limit_total_hits_total", "rls_requests_total")
FUZZ = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.large_base_example, HealthCheck.filter_too_much],
)

# Fixed defect (docs/reliability.md, "Bugs found and fixed"): a RateLimitOverride whose
# unit_multiplier
# (unknown field 3) makes the window longer than int64 seconds crashes the response conversion
# with UNKNOWN "Value out of range". test_request_limits.py::test_huge_unit_multiplier_override
# asserts the correct behaviour (xfail strict); the generators keep multipliers below 2**32
# (the config's own bound) and a hit on this exact signature is set aside, not hidden.
KNOWN_UNKNOWN = re.compile(r"(?!)")  # fixed: nothing is set aside any more (matches nothing)
known_hits: list[str] = []


@pytest.fixture(scope="module")
def server(rls_module) -> RlsProcess:
    return rls_module(CONFIG, args=("--max-request-bytes", str(4 * 1024 * 1024)))


@pytest.fixture(scope="module")
def raw(server: RlsProcess) -> Iterator[grpc.UnaryUnaryMultiCallable]:
    channel = grpc.insecure_channel(
        server.grpc_addr, options=[("grpc.max_send_message_length", 16 * 1024 * 1024)]
    )
    yield channel.unary_unary(METHOD)  # bytes in, bytes out: no serializer
    channel.close()


# -- generators -----------------------------------------------------------------------------

CHARS = st.sampled_from(
    [*SEPARATORS, "a", "b", "g", " ", "\x00", "\x01", "\x1b", "\x7f", "\n", "\t", "\r",
     "é", "ß", "\u2028", "\ufeff", "\u200b", "😀", "*", "/", "\\", "="]
)
TEXT = st.one_of(
    st.text(CHARS, max_size=12),
    st.sampled_from(["", "guard", "g", "k", "a", "a|b", "b|x%y#z{w}_.:", "x%y#z{w}_.:",
                     "user", "path", "/api/v1", "conc", "win", "free", "%7C", "a_b", "{tag}"]),
    st.text(max_size=8),
)
KEYS = st.sampled_from(
    [b"k", b"a|b", b"a", b"user", b"path", b"conc", b"win", b"free", b"x", b"%7C", b"{t}"]
)
INVALID_UTF8 = st.sampled_from(
    [b"\xff", b"\xc3\x28", b"g\xff\xfe", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf",
     b"\x80", b"abc\xe2\x82"]
)
HUGE = st.builds(
    lambda n, unit: unit * n,
    st.sampled_from([MAX_VALUE, MAX_VALUE + 1, 65_536, 1_000_000]),
    st.sampled_from([b"v", "é".encode(), b"|", b"\x00"]),
)


@st.composite
def field_bytes(draw: st.DrawFn, budget: list[int] | None = None) -> bytes:
    """One string field's bytes; at most `budget[0]` huge ones per request (so a request stays
    under the server's --max-request-bytes and reaches the validator); `budget[1]` true: text
    only (about half the requests are built clean so that plenty are accepted and charged)."""
    kinds = ["text"] * 6 + ["binary", "invalid"]
    if budget is not None and budget[1]:  # a "clean" request: well-formed text only
        kinds = ["text"]
    elif budget is not None and budget[0] > 0:
        kinds.append("huge")
    kind = draw(st.sampled_from(kinds))
    if kind == "text":
        return draw(TEXT).encode()
    if kind == "binary":
        return draw(st.binary(max_size=12))
    if kind == "invalid":
        return draw(INVALID_UTF8)
    assert budget is not None
    budget[0] -= 1
    return draw(HUGE)


def decoded(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


OVERRIDE = st.one_of(
    st.none(),
    st.tuples(
        st.sampled_from([0, 1, 5, 4294967295]),
        st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 8, 99, -1, 2**31 - 1]),
        st.one_of(st.none(), st.sampled_from([0, 1, 2, 30, 1000, 2**32 - 1])),
    ),
)
HITS = st.one_of(st.none(), st.sampled_from([0, 1, 3, MAX_HITS, MAX_HITS + 1, 2**63, 2**64 - 1]))


class Case:
    """A request and what its construction says about it; a short repr for failure reports."""

    def __init__(self, data: bytes, expect_valid: bool | None = None, problems: str = "") -> None:
        self.data = data
        self.expect_valid = expect_valid
        self.problems = problems

    def __repr__(self) -> str:
        head = self.data[:120].hex()
        return (f"Case({len(self.data)} bytes {head}{'…' if len(self.data) > 120 else ''}, "
                f"expect_valid={self.expect_valid}, problems={self.problems!r})")


@st.composite
def structured(draw: st.DrawFn) -> Case:
    """A request built field by field, and whether it is valid by construction (None: depends
    on more than the validator, e.g. an override with an unknown unit on an unknown domain)."""
    problems: list[str] = []
    unsure = False
    clean = draw(st.booleans())
    budget = [1, int(clean)]
    domain = DOMAIN.encode() if clean else draw(
        st.one_of(st.just(DOMAIN.encode()), field_bytes(budget))
    )
    text = decoded(domain)
    if text is None:
        problems.append("domain not UTF-8")
    elif not text:
        problems.append("empty domain")
    elif len(text) > MAX_VALUE:
        problems.append("domain too long")

    shapes = ["small"] * 8 + ["none", "at_limit", "over_limit", "10000"]
    shape = "small" if clean else draw(st.sampled_from(shapes))
    count = {"small": draw(st.integers(0, 4)), "none": 0, "at_limit": MAX_DESCRIPTORS - 1,
             "over_limit": MAX_DESCRIPTORS, "10000": 9_999}[shape]
    descs: list[bytes] = []
    for i in range(min(count, 3)):
        entry_shapes = ["small"] * 8 + ["at_limit", "over_limit", "10000"]
        entry_shape = "small" if clean else draw(st.sampled_from(entry_shapes))
        n = {"small": draw(st.integers(0, 4)), "at_limit": MAX_ENTRIES,
             "over_limit": MAX_ENTRIES + 1, "10000": 10_000}[entry_shape]
        pairs = [(draw(KEYS) if clean else draw(field_bytes(budget)), draw(field_bytes(budget)))
                 for _ in range(min(n, 3))]
        pairs += [(b"k", b"v")] * (n - len(pairs))
        if n > MAX_ENTRIES:
            problems.append(f"descriptor {i}: {n} entries")
        for key, value in pairs[:3]:
            k, v = decoded(key), decoded(value)
            if k is None or v is None:
                problems.append(f"descriptor {i}: entry not UTF-8")
            elif not k:
                problems.append(f"descriptor {i}: empty key")
            elif len(k) > MAX_VALUE:  # a value that long is decided by a stand-in (a digest)
                problems.append(f"descriptor {i}: entry key too long")
        hits = draw(HITS)
        if hits is not None and hits > MAX_HITS:
            problems.append(f"descriptor {i}: hits {hits}")
        override = draw(OVERRIDE)
        if override is not None:
            multiplier = override[2] or 1
            if override[1] == 0:
                problems.append(f"descriptor {i}: override without unit")
            elif not 1 <= override[1] <= 7:
                unsure = True  # rejected by the limiter only when the domain is configured
            elif UNIT_SECONDS[Unit(override[1])] * multiplier > MAX_WINDOW_SECONDS:
                problems.append(f"descriptor {i}: override window longer than 100 years")
        descs.append(descriptor(pairs, hits, draw(st.booleans()), override))
    descs += [descriptor([(b"k", b"v")])] * (count - len(descs))
    # The guard rides along in every request but the one with no descriptors at all (so
    # at_limit is exactly the limit, over_limit one more, 10000 exactly 10,000).
    if shape != "none":
        at = draw(st.integers(0, len(descs)))
        descs.insert(at, GUARD_DESCRIPTOR)
    total = len(descs)
    if total == 0:
        problems.append("no descriptors")
    elif total > MAX_DESCRIPTORS:
        problems.append(f"{total} descriptors")
    # RateLimitRequest.hits_addend is uint32: larger varints are truncated by the parser.
    request_hits = draw(st.sampled_from([0, 0, 0, 1, 2, 2**32 - 1, 2**64 - 1]))
    expect_valid: bool | None = False if problems else (None if unsure else True)
    return Case(request(domain, descs, request_hits), expect_valid, "; ".join(problems))


@st.composite
def valid_request(draw: st.DrawFn) -> bytes:
    descs = [GUARD_DESCRIPTOR]
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(["k", "a|b", "a", "user", "conc", "win", "free", "x"]))
        pairs = [(key.encode(), draw(TEXT).encode())]
        if key == "user":
            pairs.append((b"path", draw(st.sampled_from([b"/api/x", b"/other", b"|"]))))
        descs.insert(draw(st.integers(0, len(descs))),
                     descriptor(pairs, draw(st.sampled_from([None, 0, 2])), draw(st.booleans())))
    return request(DOMAIN.encode(), descs, draw(st.sampled_from([0, 1, 3])))


@st.composite
def mutated(draw: st.DrawFn) -> Case:
    data = bytearray(draw(valid_request()))
    for _ in range(draw(st.integers(1, 3))):
        # Mostly length-preserving edits, which keep the framing and reach the validator.
        op = draw(st.sampled_from(
            ["flip"] * 3 + ["set"] * 2 + ["separator"] * 3
            + ["insert", "delete", "duplicate", "truncate"]
        ))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[pos] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF, 0x0A, 0x12, 0x22]))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[pos:pos + draw(st.integers(1, 8))]
        elif op == "duplicate":
            end = pos + draw(st.integers(1, 16))
            data[pos:pos] = data[pos:end]
        elif op == "truncate":
            del data[pos:]
        elif data:
            data[pos] = ord(draw(st.sampled_from(list(SEPARATORS))))
    return Case(bytes(data))


RANDOM_BYTES = st.one_of(
    st.binary(max_size=256),
    st.binary(max_size=64).map(lambda b: b"\x0a\x02fz" + b),  # valid domain, junk after it
    st.binary(max_size=64).map(lambda b: b"\x0a\x02fz\x12" + b),  # a descriptor field of junk
).map(Case)


# -- the property -----------------------------------------------------------------------------


_last_snapshot: list[tuple[int, dict[str, float]]] = []  # valid while nothing was accepted


def snapshot(server: RlsProcess) -> tuple[int, dict[str, float]]:
    return counter_used(server.http_url, DOMAIN, GUARD), metric_sums(server.http_url, WATCHED)


def snapshot_before(server: RlsProcess) -> tuple[int, dict[str, float]]:
    """The state before a call: the snapshot taken after the previous call when that one was
    rejected (a rejection changes nothing, by the very property checked), else a fresh one."""
    if not _last_snapshot:
        _last_snapshot.append(snapshot(server))
    return _last_snapshot[0]


def descriptor_count(data: bytes) -> int | None:
    try:
        return len(rls_pb2.RateLimitRequest.FromString(data).descriptors)
    except DecodeError:
        return None


def check(server: RlsProcess, raw: grpc.UnaryUnaryMultiCallable, data: bytes) -> Outcome:
    before = snapshot_before(server)
    _last_snapshot.clear()
    outcome = call(raw, data)
    assert server.proc.poll() is None, (
        f"rls exited ({server.proc.returncode}) on input {data[:200].hex()}\n{server.log()[-3000:]}"
    )
    if outcome.code == grpc.StatusCode.UNKNOWN and KNOWN_UNKNOWN.search(outcome.details):
        known_hits.append(data.hex())
        reject()
    assert outcome.code in ALLOWED, (
        f"input {data[:300].hex()} ({len(data)} bytes): expected OK or INVALID_ARGUMENT, "
        f"got {outcome!r}"
    )
    event(f"answer: {outcome.code.name}"
          + (f" overall={outcome.response.overall_code}" if outcome.response else ""))
    if outcome.response is not None:
        resp = outcome.response
        assert resp.overall_code in (rls_pb2.RateLimitResponse.OK,
                                     rls_pb2.RateLimitResponse.OVER_LIMIT), resp
        expected = descriptor_count(data)
        assert len(resp.statuses) == expected, (data.hex(), resp)
    else:
        assert outcome.details.strip(), f"INVALID_ARGUMENT without a message for {data.hex()}"
        after = snapshot(server)
        _last_snapshot.append(after)
        assert after == before, (
            f"rejected input {data[:300].hex()} ({outcome.details!r}) changed counters: "
            f"guard used / metrics {before} -> {after}"
        )
    return outcome


@FUZZ
@given(case=RANDOM_BYTES)
def test_random_bytes(server, raw, case):
    check(server, raw, case.data)


@FUZZ
@given(case=mutated())
def test_mutated_valid_requests(server, raw, case):
    check(server, raw, case.data)


@FUZZ
@given(case=structured())
def test_structured_requests(server, raw, case):
    data, expect_valid, problems = case.data, case.expect_valid, case.problems
    outcome = check(server, raw, data)
    if expect_valid is True:
        assert outcome.response is not None, (
            f"valid request rejected: {outcome!r} {data[:300].hex()}"
        )
    elif expect_valid is False:
        assert outcome.code == grpc.StatusCode.INVALID_ARGUMENT, (
            f"invalid request ({problems}) accepted: {outcome!r} {data[:300].hex()}"
        )


def test_server_still_healthy_after_fuzzing(server, raw):
    """Runs last in this module: the process is up, healthy, decides exactly, and logged no
    unexpected exception (grpc logs one as `Unexpected [Error] raised by servicer method`)."""
    assert server.proc.poll() is None
    assert http_get(server.http_url + "/healthcheck")[0] == 200
    before = counter_used(server.http_url, DOMAIN, GUARD)
    outcome = call(raw, request(DOMAIN.encode(), [descriptor([(b"guard", b"g")])]))
    assert outcome.response is not None and outcome.response.overall_code == 1, outcome
    assert counter_used(server.http_url, DOMAIN, GUARD) == before + 1
    unexpected = [
        block for block in server.log().split("Unexpected [")[1:]
        if not KNOWN_UNKNOWN.search(block.split("\n\n")[0])
    ]
    assert not unexpected, "unexpected exceptions in the rls log:\n" + "\n".join(unexpected)[:5000]
    print(f"\nknown-bug inputs set aside during fuzzing: {len(known_hits)} {known_hits[:3]}")
