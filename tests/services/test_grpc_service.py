"""The gRPC RateLimitService of a real `rls serve` process, on the memory and Redis backends.

DESIGN §6 (decisions), §10 (bad requests: INVALID_ARGUMENT with a clear message, never a
charged counter; SIGTERM exits 0), §3 (is_negative_hits is field 4, read from unknown fields).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf.wrappers_pb2 import UInt64Value
from grpc_health.v1 import health_pb2, health_pb2_grpc

METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
DOMAIN = "grpc"
YEAR_SECONDS = 31_536_000
OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT

CONFIG = """
domain: grpc
descriptors:
  - key: k
    rate_limit: {name: k_limit, unit: year, requests_per_unit: 3, accept_releases: true}
  - key: anon
    rate_limit: {unit: year, requests_per_unit: 100}
  - key: guard
    rate_limit: {unit: year, requests_per_unit: 10}
  - key: path
    value: "/api/*"
    rate_limit: {unit: year, requests_per_unit: 2}
"""


# -- wire helpers ---------------------------------------------------------------------------


def varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def ld(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def desc(*entries: tuple[str, str], hits: int | None = None) -> ratelimit_pb2.RateLimitDescriptor:
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        d.hits_addend.CopyFrom(UInt64Value(value=hits))
    return d


def request(*descs: ratelimit_pb2.RateLimitDescriptor, domain: str = DOMAIN,
            hits: int = 0) -> rls_pb2.RateLimitRequest:
    return rls_pb2.RateLimitRequest(domain=domain, descriptors=list(descs), hits_addend=hits)


class Client:
    def __init__(self, addr: str) -> None:
        self.channel = grpc.insecure_channel(addr)
        self.stub = rls_pb2_grpc.RateLimitServiceStub(self.channel)
        self.raw = self.channel.unary_unary(METHOD)  # bytes in, bytes out

    def call(self, req: rls_pb2.RateLimitRequest) -> rls_pb2.RateLimitResponse:
        return self.stub.ShouldRateLimit(req, timeout=10)

    def call_raw(self, data: bytes) -> rls_pb2.RateLimitResponse:
        return rls_pb2.RateLimitResponse.FromString(self.raw(data, timeout=10))

    def remaining(self, key: str, value: str) -> int:
        """limit_remaining of a 0-hit check (descriptor hits_addend 0 charges nothing)."""
        resp = self.call(request(desc((key, value), hits=0)))
        assert resp.statuses[0].code == OK, resp
        return resp.statuses[0].limit_remaining

    def close(self) -> None:
        self.channel.close()


@pytest.fixture(params=["memory", "redis"])
def service(request, rls_factory, tmp_path: Path):
    path = tmp_path / "grpc.yaml"
    path.write_text(CONFIG)
    args: tuple[str, ...] = ()
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        # A generous deadline: this checks behaviour, not latency (failure mode would hide it).
        args = ("--redis-url", url, "--backend-timeout-ms", "2000")
    return rls_factory(path, args=args)


@pytest.fixture
def client(service) -> Iterator[Client]:
    c = Client(service.grpc_addr)
    yield c
    c.close()


# -- decisions ------------------------------------------------------------------------------


def test_allowed_then_rejected(client):
    for expected in (2, 1, 0):
        resp = client.call(request(desc(("k", "a")), desc(("anon", "a"))))
        assert resp.overall_code == OK
        st, anon = resp.statuses
        assert st.code == OK and st.limit_remaining == expected
        assert st.current_limit.requests_per_unit == 3
        assert st.current_limit.unit == rls_pb2.RateLimitResponse.RateLimit.YEAR
        assert st.current_limit.name == "k_limit"
        assert 0 < st.duration_until_reset.seconds <= YEAR_SECONDS
        # current_limit.name is filled only when the limit has a name.
        assert anon.current_limit.requests_per_unit == 100 and anon.current_limit.name == ""
    resp = client.call(request(desc(("k", "a")), desc(("anon", "a"))))
    assert resp.overall_code == OVER
    assert resp.statuses[0].code == OVER and resp.statuses[0].limit_remaining == 0
    assert resp.statuses[0].current_limit.requests_per_unit == 3
    # The passing descriptor of the rejected request was not charged.
    assert resp.statuses[1].code == OK and resp.statuses[1].limit_remaining == 97
    assert client.remaining("anon", "a") == 97


def _invalid_cases() -> list[tuple[str, object]]:
    guard = desc(("guard", "g"))
    guard_bytes = guard.SerializeToString()
    bad_utf8_entry = ld(1, ld(1, b"guard") + ld(2, b"g\xff\xfe"))
    return [
        ("empty domain", request(guard, domain="")),
        ("no descriptors", request()),
        ("empty entry key", request(guard, desc(("", "v")))),
        ("too many descriptors", request(*([guard] * 65))),
        ("too many entries", request(guard, desc(*[(f"k{i}", "v") for i in range(33)]))),
        ("key longer than 1024", request(guard, desc(("k" * 1025, "v")))),
        ("hits_addend absurdly large", request(guard, desc(("anon", "a"), hits=2**64 - 1))),
        ("invalid UTF-8 in domain", ld(1, b"gr\xc3\x28pc") + ld(2, guard_bytes)),
        ("invalid UTF-8 in entry value", ld(1, DOMAIN.encode()) + ld(2, guard_bytes)
         + ld(2, bad_utf8_entry)),
        ("garbage bytes", b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"),
        ("truncated message", ld(1, DOMAIN.encode()) + b"\x12\x40" + guard_bytes),
    ]


def test_values_longer_than_the_bound_are_decided_each_on_its_own_counter(client):
    """A value over --max-value-bytes (a padded `:path`) is decided, not refused: refused, Envoy
    (failure_mode_deny false by default) would let it through unlimited. Two values that differ
    only past the bound keep two counters; a prefix wildcard still matches."""
    head = "/api/" + "x" * 3000
    first, second = head + "a", head + "b"
    for remaining in (1, 0):
        st = client.call(request(desc(("path", first)))).statuses[0]
        assert (st.code, st.limit_remaining) == (OK, remaining)
    assert client.call(request(desc(("path", first)))).overall_code == OVER
    assert client.call(request(desc(("path", second)))).statuses[0].limit_remaining == 1
    assert client.call(request(desc(("path", "/other/" + "x" * 3000)))).statuses[0].code == OK


def test_invalid_requests_are_rejected_and_charge_nothing(client):
    first = client.call(request(desc(("guard", "g"))))
    assert first.overall_code == OK and first.statuses[0].limit_remaining == 9
    problems = []
    for name, req in _invalid_cases():
        try:
            if isinstance(req, bytes):
                resp = client.call_raw(req)
            else:
                resp = client.call(req)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.INVALID_ARGUMENT:
                problems.append(f"{name}: status {exc.code()} ({exc.details()!r})")
            elif not (exc.details() or "").strip():
                problems.append(f"{name}: INVALID_ARGUMENT without a message")
        else:
            problems.append(f"{name}: accepted, overall_code={resp.overall_code}")
        left = client.remaining("guard", "g")
        if left != 9:
            problems.append(f"{name}: guard counter changed, remaining {left} instead of 9")
    assert not problems, "\n".join(problems)
    # The service is still answering normally.
    assert client.call(request(desc(("guard", "g")))).statuses[0].limit_remaining == 8


def test_health_serving_and_unknown_domain(client):
    stub = health_pb2_grpc.HealthStub(client.channel)
    for name in ("", "envoy.service.ratelimit.v3.RateLimitService"):
        resp = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING, name
    # Unknown domain: OK, one status per descriptor, no limit.
    for _ in range(5):
        resp = client.call(request(desc(("k", "a")), desc(("x", "y")), domain="nope"))
        assert resp.overall_code == OK
        assert [s.code for s in resp.statuses] == [OK, OK]
        assert not resp.statuses[0].HasField("current_limit")


def test_is_negative_hits_raw_field_releases(client):
    for _ in range(3):
        assert client.call(request(desc(("k", "neg")))).overall_code == OK
    assert client.call(request(desc(("k", "neg")))).overall_code == OVER
    # RateLimitDescriptor.is_negative_hits (field 4, varint 1), absent from xds-protos.
    release = desc(("k", "neg"), hits=2).SerializeToString() + b"\x20\x01"
    resp = client.call_raw(ld(1, DOMAIN.encode()) + ld(2, release))
    assert resp.overall_code == OK
    assert client.remaining("k", "neg") == 2
    resp = client.call(request(desc(("k", "neg"))))
    assert resp.overall_code == OK and resp.statuses[0].limit_remaining == 1


def test_sigterm_exits_zero(service, client):
    assert client.call(request(desc(("anon", "t")))).overall_code == OK
    client.close()
    service.proc.send_signal(signal.SIGTERM)
    assert service.proc.wait(timeout=15) == 0, service.log()
