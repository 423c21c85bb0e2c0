"""`rls.counters.v1.Counters` over gRPC under hostile callers (issue 24 item 6), on a real
`rls serve` (one per module) with its counters in a real Redis: undecodable bytes, invalid
UTF-8, oversized batches, fields out of range and random requests get INVALID_ARGUMENT (a
batch: nothing charged), never UNKNOWN or a traceback. (`time_span` ranges per unit: the
counters work of issue 24 item 2.)"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from conftest import RlsProcess, start_redis
from support.grpc_surface import assert_no_traceback, assert_serving, code_of, start_rls

from rls.frequency.model import MAX_BATCH, MAX_DOMAIN_BYTES, MAX_HITS, MAX_KEY_BYTES
from rls.frequency.proto import counters_pb2

pytestmark = pytest.mark.process

pb: Any = counters_pb2
SERVICE = "/rls.counters.v1.Counters/"
METHODS = ("Add", "Get", "BatchAdd", "BatchGet")


@pytest.fixture(scope="module")
def rls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RlsProcess]:
    """One process and one Redis for the module: no test here may charge `hostile`/`k`."""
    redis = start_redis()
    server = start_rls(tmp_path_factory.mktemp("counters"), "--redis-url", redis.url)
    try:
        yield server
    finally:
        server.stop()
        redis.stop()


def item(**fields: Any) -> Any:
    base = {"domain": "hostile", "key": "k", "time_span": 1, "time_unit": pb.HOUR, "hits": 1}
    base.update(fields)
    return pb.CounterRequest(**base)


def call(rls: RlsProcess, method: str, raw: bytes) -> grpc.StatusCode:
    with grpc.insecure_channel(rls.grpc_addr) as channel:
        return code_of(lambda: channel.unary_unary(SERVICE + method)(raw, timeout=10))


def freq(rls: RlsProcess, key: str = "k") -> int:
    with grpc.insecure_channel(rls.grpc_addr) as channel:
        get = channel.unary_unary(SERVICE + "Get",
                                  response_deserializer=pb.CounterResult.FromString)
        return int(get(item(key=key).SerializeToString(), timeout=10).freq)


def not_utf8(message: Any, text: str) -> bytes:
    raw = message.SerializeToString()
    assert raw.count(text.encode()) == 1
    return raw.replace(text.encode(), b"\xff" * len(text))


@pytest.mark.parametrize("method", METHODS)
def test_undecodable_requests_are_invalid_argument(rls: RlsProcess, method: str) -> None:
    batch = method.startswith("Batch")
    utf8 = (pb.BatchRequest(items=[item(key="zzzz")]) if batch else item(key="zzzz"))
    for raw in (b"\xff\xff\xff\x0f garbage", b"\x0a\x05ab", not_utf8(utf8, "zzzz")):
        assert call(rls, method, raw) == grpc.StatusCode.INVALID_ARGUMENT, raw[:20]
    assert freq(rls) == 0
    assert_no_traceback(rls)


BAD_ITEMS = {
    "no_domain": item(domain=""),
    "domain_too_long": item(domain="d" * (MAX_DOMAIN_BYTES + 1)),
    "key_too_long": item(key="k" * (MAX_KEY_BYTES + 1)),
    "no_unit": item(time_unit=0),
    "unknown_unit": item(time_unit=99),
    "unknown_window": item(window=7),
    "hits_too_many": item(hits=MAX_HITS + 1),
    "hits_uint64_max": item(hits=2**64 - 1),
    "unknown_zone": item(timezone="Mars/Olympus"),
    "zone_path": item(timezone="../../etc/passwd"),
}


@pytest.mark.parametrize("name", sorted(BAD_ITEMS))
def test_a_bad_item_is_invalid_argument_and_its_batch_charges_nothing(rls: RlsProcess,
                                                                      name: str) -> None:
    bad = BAD_ITEMS[name].SerializeToString()
    assert call(rls, "Add", bad) == grpc.StatusCode.INVALID_ARGUMENT
    batch = pb.BatchRequest(items=[item(), BAD_ITEMS[name], item()]).SerializeToString()
    assert call(rls, "BatchAdd", batch) == grpc.StatusCode.INVALID_ARGUMENT
    assert freq(rls) == 0
    assert_no_traceback(rls)


@pytest.mark.parametrize("size", [0, MAX_BATCH + 1, 10_000])
def test_batches_out_of_range_are_invalid_argument(rls: RlsProcess, size: int) -> None:
    batch = pb.BatchRequest(items=[item()] * size).SerializeToString()
    for method in ("BatchAdd", "BatchGet"):
        assert call(rls, method, batch) == grpc.StatusCode.INVALID_ARGUMENT
    assert freq(rls) == 0


def test_random_requests_are_answered_or_refused_never_crashed(rls: RlsProcess) -> None:
    """500 requests with random fields (time_span kept to 1..1000: larger spans per unit are
    issue 24 item 2): every answer is OK or INVALID_ARGUMENT."""
    rng = random.Random(24)

    def text() -> str:
        return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0x2FFF)]))
                       for _ in range(rng.choice([0, 1, 8, 200, 1100])))

    def one() -> Any:
        return pb.CounterRequest(
            domain=text(), key=text(), time_span=rng.randrange(0, 1001),
            time_unit=rng.randrange(0, 8), hits=rng.choice([0, 1, 7, MAX_HITS, 2**63]),
            timezone=rng.choice(["", "UTC", "Asia/Tokyo", text()]), window=rng.randrange(0, 3))

    seen: dict[grpc.StatusCode, int] = {}
    for _ in range(500):
        method = rng.choice(METHODS)
        if method.startswith("Batch"):
            raw = pb.BatchRequest(items=[one() for _ in range(rng.randint(1, 5))])
        else:
            raw = one()
        code = call(rls, method, raw.SerializeToString())
        seen[code] = seen.get(code, 0) + 1
    assert set(seen) <= {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT}, seen
    assert_no_traceback(rls)
    assert_serving(rls)
