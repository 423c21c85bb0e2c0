"""The counters API through a real `rls serve` process: gRPC rls.counters.v1 on the
RateLimitService port, admin HTTP /v1/counters/*, on a real redis-server and on memory."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
import pytest
from conftest import start_redis

from rls.frequency.proto import counters_pb2 as pb
from rls.frequency.proto import counters_pb2_grpc

TOKEN = "c0unters"
CONFIG = (
    "domain: any\ndescriptors:\n  - key: k\n"
    "    rate_limit: {unit: hour, requests_per_unit: 1}\n"
)


def http(base: str, path: str, body, headers=None, content_type="application/json"):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method="POST")
    req.add_header("Content-Type", content_type)
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


@pytest.fixture(params=["redis", "memory"])
def server(request, rls_factory, tmp_path):
    cfg = tmp_path / "d.yaml"
    cfg.write_text(CONFIG)
    counters = tmp_path / "counters.yaml"
    counters.write_text("domains:\n  ads: {timezone: Asia/Shanghai, key_hash: md5}\n")
    args = ("--counters-config", str(counters))
    if request.param == "redis":
        args += ("--redis-url", request.getfixturevalue("redis_url"))
    return rls_factory(cfg, args=args, env={"RLS_ADMIN_TOKEN": TOKEN})


def test_grpc_add_get_and_batches_on_the_ratelimit_port(server):
    with grpc.insecure_channel(server.grpc_addr) as channel:
        stub = counters_pb2_grpc.CountersStub(channel)
        req = pb.CounterRequest(domain="ads", key="u1", time_span=1, time_unit=pb.DAY, hits=2)
        first = stub.Add(req, timeout=5)
        assert first.code == pb.OK and first.freq == 2 and 0 < first.ttl <= 86_400
        assert stub.Get(req, timeout=5).freq == 2
        batch = pb.BatchRequest(
            items=[pb.CounterRequest(domain="ads", key=f"b{i}", time_unit=pb.HOUR)
                   for i in range(30)]
        )
        out = stub.BatchAdd(batch, timeout=5)
        assert out.code == pb.OK and [r.freq for r in out.results] == [1] * 30
        assert [r.freq for r in stub.BatchGet(batch, timeout=5).results] == [1] * 30
        # One invalid item: the whole batch fails and nothing is charged.
        bad = pb.BatchRequest(items=[*batch.items[:29], pb.CounterRequest(domain="ads")])
        with pytest.raises(grpc.RpcError) as err:
            stub.BatchAdd(bad, timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "item 29" in err.value.details()
        assert [r.freq for r in stub.BatchGet(batch, timeout=5).results] == [1] * 30
        too_many = pb.BatchRequest(items=[batch.items[0]] * 31)
        with pytest.raises(grpc.RpcError) as err:
            stub.BatchGet(too_many, timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_http_add_needs_token_and_json_and_answers_freq_ttl(server):
    base = server.http_url
    item = {"appid": "ads", "key": "u2", "time_span": 2, "time_unit": "day", "hits": 3}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert http(base, "/v1/counters/add", item)[0] == 401
    assert http(base, "/v1/counters/add", item, auth, content_type="text/plain")[0] == 415
    status, body = http(base, "/v1/counters/add", item, auth)
    assert status == 200 and body["code"] == "ok" and body["freq"] == 3
    assert 0 < body["ttl"] <= 2 * 86_400
    status, body = http(base, "/v1/counters/get", item)  # Get needs no token
    assert status == 200 and body["freq"] == 3 and "stale" not in body
    status, body = http(base, "/v1/counters/batch_add",
                        {"items": [item, {**item, "time_unit": "fortnight"}]}, auth)
    assert status == 400 and body["errors"][0]["index"] == 1
    assert http(base, "/v1/counters/get", item)[1]["freq"] == 3  # nothing charged
    status, body = http(base, "/v1/counters/batch_get", {"items": [item, {**item, "key": "x"}]})
    assert status == 200 and [r["freq"] for r in body["results"]] == [3, 0]
    with urllib.request.urlopen(base + "/v1/counters/list?domain=ads", timeout=5) as resp:
        listed = json.loads(resp.read())["counters"]
    assert "u2" in [c["original"] for c in listed]  # md5 keys keep the original


def test_every_http_refusal_has_the_counters_shape(server):
    """docs/counters.md: every refusal on /v1/counters/* is {"code": "invalid", "message": …},
    the admin listener's own refusals (401 token, 415 content type, 413 size) included."""
    base = server.http_url
    item = {"appid": "ads", "key": "u3", "time_unit": "day"}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    refusals = [
        http(base, "/v1/counters/add", item),
        http(base, "/v1/counters/add", item, auth, content_type="text/plain"),
        http(base, "/v1/counters/get", item, content_type="text/plain"),
        http(base, "/v1/counters/add", b"{" + b" " * (2 << 20) + b"}", auth),
        http(base, "/v1/counters/get", b"{not json"),
    ]
    assert [status for status, _ in refusals] == [401, 415, 415, 413, 400]
    for _, body in refusals:
        assert set(body) == {"code", "message"} and body["code"] == "invalid", body


def test_store_down_add_is_an_error_get_is_stale(rls_factory, tmp_path):
    own = start_redis()
    cfg = tmp_path / "d.yaml"
    cfg.write_text(CONFIG)
    srv = rls_factory(cfg, args=("--redis-url", own.url))
    item = {"domain": "d", "key": "k", "time_unit": "hour"}
    try:
        assert http(srv.http_url, "/v1/counters/add", item)[1]["freq"] == 1
        own.stop()
        status, body = http(srv.http_url, "/v1/counters/add", item)
        assert status == 503 and body["code"] == "unavailable"
        status, body = http(srv.http_url, "/v1/counters/get", item)
        assert status == 200 and body["freq"] == 1 and body["stale"] is True
        with grpc.insecure_channel(srv.grpc_addr) as channel:
            stub = counters_pb2_grpc.CountersStub(channel)
            req = pb.CounterRequest(domain="d", key="k", time_unit=pb.HOUR)
            with pytest.raises(grpc.RpcError) as err:
                stub.Add(req, timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            got = stub.Get(req, timeout=5)
            assert got.stale and got.freq == 1
        with urllib.request.urlopen(srv.http_url + "/metrics", timeout=5) as resp:
            assert "rls_counters_stale_answers_total 2.0" in resp.read().decode()
    finally:
        own.stop()


def test_bad_counters_config_stops_the_server_with_the_file_and_reason(rls_factory, tmp_path):
    cfg = tmp_path / "d.yaml"
    cfg.write_text(CONFIG)
    bad = tmp_path / "counters.yaml"
    bad.write_text("domains:\n  ads: {timezone: Mars/Base}\n")
    srv = rls_factory(cfg, args=("--counters-config", str(bad)), wait_healthy=False)
    assert srv.proc.wait(30) != 0
    assert "counters.yaml" in srv.log() and "Mars/Base" in srv.log()


def test_http_batch_over_30_items_is_refused(server):
    item = {"domain": "d", "key": "k", "time_unit": "hour"}
    status, body = http(server.http_url, "/v1/counters/batch_get", {"items": [item] * 31})
    assert status == 400 and "30" in body["message"]
