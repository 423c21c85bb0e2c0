"""The counters API under hostile and heavy use (issue 24 item 2): its HTTP routes obey the admin
API's body rules (size 413, nesting and syntax 400, read time 408, JSON errors, never a 500);
every `time_span` of the documented per-unit range works on both stores and one more is a clear
400 / INVALID_ARGUMENT; listings stop at 1,000 on every store, show the original key of every
domain, and a key that is not a counter is skipped instead of failing the listing. The memory
store of counters is bounded in bytes like the rate-limit one (item 3)."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry
from support.net import http_call

from rls.admin.auth import BODY_SECONDS
from rls.config.model import Unit
from rls.frequency.model import (
    MAX_LISTING,
    MAX_SPANS,
    UNITS,
    CountersConfig,
    DomainOptions,
    InvalidItem,
    make_item,
)
from rls.frequency.proto import counters_pb2 as pb
from rls.frequency.proto import counters_pb2_grpc
from rls.frequency.service import CountersService
from rls.frequency.storage import MemoryCounterStore, RedisCounterStore, _cost
from rls.stores.redis import RedisBackend

TOKEN = "c0unters"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CONFIG = ("domain: any\ndescriptors:\n  - key: k\n"
          "    rate_limit: {unit: hour, requests_per_unit: 1}\n")
ROUTES = ("/v1/counters/add", "/v1/counters/get", "/v1/counters/batch_add",
          "/v1/counters/batch_get")
CFG = CountersConfig(domains={"plain": DomainOptions("UTC", ""),
                              "hashed": DomainOptions("UTC", "md5")})
UNIT_OF = {unit: name for name, unit in UNITS.items()}


def post(base: str, path: str, body: bytes, headers: dict[str, str] | None = None
         ) -> tuple[int, Any]:
    return http_call(base, "POST", path, body,
                     {"Content-Type": "application/json", **AUTH, **(headers or {})})


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.fixture
def server(rls_factory, tmp_path):
    cfg = tmp_path / "d.yaml"
    cfg.write_text(CONFIG)
    counters = tmp_path / "counters.yaml"
    counters.write_text("domains:\n  hashed: {key_hash: md5}\n")
    return rls_factory(cfg, args=("--counters-config", str(counters)),
                       env={"RLS_ADMIN_TOKEN": TOKEN})


BAD = {
    "malformed": (b"{not json", 400),
    "empty": (b"", 400),
    "deep-list": (b"[" * 100_000 + b"]" * 100_000, 400),
    "deep-object": (b'{"items": ' + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"}", 400),
    "not-utf8": (b'{"domain": "\xff"}', 400),
    "lone-surrogate": (b'{"domain": "\\ud800", "key": "k", "time_unit": "day"}', 400),
    "too-large": (b'{"x": "' + b"a" * (2 << 20) + b'"}', 413),
}


def test_bad_bodies_on_every_counters_route_get_a_json_4xx_not_a_500(server) -> None:
    for case, (body, expected) in BAD.items():
        for path in ROUTES:
            if case == "lone-surrogate" and "batch" in path:
                body = b'{"items": [{"domain": "\\ud800", "key": "k", "time_unit": "day"}]}'
            try:
                status, payload = post(server.http_url, path, body)
            except (ConnectionError, urllib.error.URLError):
                # aiohttp may answer 413 and close before the client finished sending
                assert expected == 413, (path, case)
                continue
            assert status == expected, (path, case, payload)
            assert isinstance(payload, dict) and payload["code"] == "invalid", (path, case)
            assert payload["message"], (path, case, payload)
    assert "Traceback" not in server.log()


def _dribble(port: int, path: str, out: dict[str, tuple[float, bytes]]) -> None:
    """Content-Length 200, one byte every 0.5 s: the answer and how long it took."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Length: 200\r\n\r\n".encode()
        )
        sock.settimeout(0.5)
        answer = b""
        while time.monotonic() - start < BODY_SECONDS + 10 and not answer:
            try:
                sock.sendall(b" ")
                answer = sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                break
    out[path] = (time.monotonic() - start, answer)


def test_slow_bodies_are_answered_408_within_the_body_time(server) -> None:
    seen: dict[str, tuple[float, bytes]] = {}
    threads = [threading.Thread(target=_dribble, args=(server.http_port, path, seen))
               for path in ROUTES]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(BODY_SECONDS + 20)
    for path in ROUTES:
        took, answer = seen[path]
        assert answer.startswith(b"HTTP/1.1 408"), (path, answer[:200])
        assert b'"code": "invalid"' in answer, answer
        assert took < BODY_SECONDS + 3, (path, took)


@pytest.fixture(params=["memory", "redis"])
async def service(request):
    if request.param == "memory":
        yield CountersService(MemoryCounterStore(), CFG, CollectorRegistry())
        return
    backend = RedisBackend(request.getfixturevalue("redis_url"))
    client = backend.client
    await client.flushall()
    yield CountersService(RedisCounterStore(backend), CFG, CollectorRegistry())
    await backend.close()


def test_per_unit_span_bounds_are_the_documented_ones() -> None:
    assert MAX_SPANS == {Unit.SECOND: 1_000_000, Unit.MINUTE: 1_000_000, Unit.HOUR: 1_000_000,
                         Unit.DAY: 719_162, Unit.WEEK: 102_737, Unit.MONTH: 23_628}
    for unit, top in MAX_SPANS.items():
        with pytest.raises(InvalidItem, match=f"1..{top}"):
            make_item(CFG, "plain", "k", top + 1, UNIT_OF[unit])


@pytest.mark.parametrize("zone", ["UTC", "Pacific/Kiritimati", "Etc/GMT+12"])
async def test_the_longest_span_of_every_unit_counts_on_both_stores(service, zone) -> None:
    items = [make_item(CFG, "plain", f"{unit.name}-{window}", top, UNIT_OF[unit], 2, zone,
                       window)
             for unit, top in MAX_SPANS.items()
             for window in ("calendar", "rolling_from_first_hit")
             if not (unit is Unit.MONTH and window != "calendar")]
    added = await service.add(items)
    assert [r.code for r in added] == ["ok"] * len(items), [r.message for r in added]
    assert [r.freq for r in added] == [2] * len(items)
    assert all(r.ttl_ms > 0 for r in added)
    assert [r.freq for r in await service.get(items)] == [2] * len(items)


def test_a_span_beyond_its_unit_is_invalid_argument_and_400(server) -> None:
    over = {"domain": "plain", "key": "k", "time_span": MAX_SPANS[Unit.DAY] + 1,
            "time_unit": "day"}
    status, payload = post(server.http_url, "/v1/counters/add", json.dumps(over).encode())
    assert status == 400 and "1..719162" in payload["message"], payload
    status, payload = post(server.http_url, "/v1/counters/add",
                           json.dumps({**over, "time_span": MAX_SPANS[Unit.DAY]}).encode())
    assert status == 200 and payload["freq"] == 1, payload
    with grpc.insecure_channel(server.grpc_addr) as channel:
        stub = counters_pb2_grpc.CountersStub(channel)
        for unit, name in ((pb.WEEK, Unit.WEEK), (pb.MONTH, Unit.MONTH)):
            req = pb.CounterRequest(domain="plain", key="k", time_span=MAX_SPANS[name] + 1,
                                    time_unit=unit)
            with pytest.raises(grpc.RpcError) as err:
                stub.Add(req, timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            req.time_span = MAX_SPANS[name]
            assert stub.Add(req, timeout=5).freq == 1
    assert "Traceback" not in server.log()


async def test_listing_stops_at_the_cap_and_shows_every_original_key(service) -> None:
    for start in range(0, 1500, 30):
        await service.add([make_item(CFG, "plain", f"user:{i}", 1, "hour")
                           for i in range(start, start + 30)])
    await service.add([make_item(CFG, "hashed", "user:h", 1, "hour")])
    listed = await service.listing("plain")
    assert len(listed["counters"]) == MAX_LISTING and listed["truncated"] is True
    originals = {c["original"] for c in listed["counters"]}
    assert len(originals) == MAX_LISTING and originals <= {f"user:{i}" for i in range(1500)}
    hashed = await service.listing("hashed")
    assert [c["original"] for c in hashed["counters"]] == ["user:h"]
    assert hashed["truncated"] is False and hashed["skipped"] == 0


async def test_a_key_that_is_not_a_counter_is_skipped_not_fatal(redis_url) -> None:
    backend = RedisBackend(redis_url)
    client = backend.client
    await client.flushall()
    service = CountersService(RedisCounterStore(backend), CFG, CollectorRegistry())
    try:
        await service.add([make_item(CFG, "plain", f"k:{i}", 1, "day") for i in range(3)])
        await client.set("rl:c{5:plain:-4:junk:1Dc:UTC}:0", "a string")  # WRONGTYPE for HMGET
        await client.hset("rl:c{5:plain:-3:bad:1Dc:UTC}:0", "c", "not a number")
        listed = await service.listing("plain")
    finally:
        await backend.close()
    assert sorted(c["original"] for c in listed["counters"]) == ["k:0", "k:1", "k:2"]
    assert listed["skipped"] == 2 and listed["truncated"] is False


def test_http_listing_shows_original_keys_of_a_plain_domain(server) -> None:
    item = {"domain": "plain", "key": "user:ä:1", "time_unit": "hour"}
    assert post(server.http_url, "/v1/counters/add", json.dumps(item).encode())[0] == 200
    listed = get_json(server.http_url + "/v1/counters/list?domain=plain")
    assert [c["original"] for c in listed["counters"]] == ["user:ä:1"]
    assert listed["truncated"] is False and listed["skipped"] == 0


async def test_memory_counters_stay_within_their_bytes_least_recently_used_evicted() -> None:
    store = MemoryCounterStore(max_bytes=200_000)
    registry = CollectorRegistry()
    service = CountersService(store, CFG, registry)
    hot = make_item(CFG, "hashed", "hot", 1, "day")
    await service.add([hot])
    for start in range(0, 3000, 30):
        await service.add([make_item(CFG, "plain", f"user:{i}", 1, "day")
                           for i in range(start, start + 30)])
        await service.get([hot])  # used all along: never the least recently used
        assert store.nbytes <= store.max_bytes
    assert store.nbytes == sum(_cost(k, v) for k, v in store._data.items())
    evicted = registry.get_sample_value("rls_counters_memory_evictions_total")
    assert evicted == store.evictions == 3001 - len(store._data) > 0
    assert (await service.get([hot]))[0].freq == 1
    first = make_item(CFG, "plain", "user:0", 1, "day")
    assert (await service.get([first]))[0].freq == 0  # evicted: starts again from 0
