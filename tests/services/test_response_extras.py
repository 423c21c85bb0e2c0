"""Optional response extras: RateLimit-* headers, JSON 429 body, dynamic metadata."""

from __future__ import annotations

import json

import pytest
from envoy.service.ratelimit.v3 import rls_pb2
from google.protobuf.json_format import MessageToDict

from rls.config.loader import load_files
from rls.engine.limiter import DescriptorIn, RateLimiter
from rls.observability.metrics import Metrics
from rls.services import ratelimit as ratelimit_module
from rls.services.ratelimit import RateLimitService
from rls.settings import Settings
from rls.settings.reference_env import ignored
from rls.stores.memory import MemoryBackend

CONFIG = """
domain: d
descriptors:
  - key: k
    metadata: {tier: gold, nested: {a: 1}}
    rate_limit: {unit: minute, requests_per_unit: 2, name: k_limit}
  - key: ip
    metadata: {tier: silver, nested: {b: 2}}
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: q
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
"""


def service(**flags: bool | str) -> RateLimitService:
    config = load_files([("d.yaml", CONFIG)])
    settings = Settings(**flags)
    metrics = Metrics()
    limiter = RateLimiter(lambda: config, MemoryBackend(sweep_interval=0), settings, metrics)
    return RateLimitService(limiter, settings, metrics)


def request(*pairs: tuple[str, str]) -> rls_pb2.RateLimitRequest:
    req = rls_pb2.RateLimitRequest(domain="d")
    for key, value in pairs:
        desc = req.descriptors.add()
        desc.entries.add(key=key, value=value)
    return req


def headers(resp: rls_pb2.RateLimitResponse) -> dict[str, str]:
    return {h.key: h.value for h in resp.response_headers_to_add}


async def test_extras_are_off_by_default() -> None:
    resp = await service().decide(request(("k", "v")))
    assert not resp.response_headers_to_add
    assert not resp.raw_body
    assert not resp.dynamic_metadata.fields


async def test_ratelimit_headers_name_the_tightest_descriptor() -> None:
    svc = service(response_headers=True)
    resp = await svc.decide(request(("ip", "1.2.3.4"), ("k", "v")))
    h = headers(resp)
    # k has 1 left of 2, ip 9 of 10: the smallest remaining is reported.
    assert h["RateLimit-Limit"] == "2"
    assert h["RateLimit-Remaining"] == "1"
    assert 0 < int(h["RateLimit-Reset"]) <= 60
    assert h["RateLimit-Policy"] == "10;w=3600, 2;w=60"


async def test_over_limit_descriptor_wins_the_headers_even_with_more_remaining() -> None:
    svc = service(response_headers=True)
    for _ in range(2):
        await svc.decide(request(("k", "v")))
    resp = await svc.decide(request(("k", "v"), ("ip", "9.9.9.9")))
    assert resp.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT
    h = headers(resp)
    assert (h["RateLimit-Limit"], h["RateLimit-Remaining"]) == ("2", "0")


async def test_json_body_only_on_over_limit_with_retry_after() -> None:
    svc = service(json_body=True)
    ok = await svc.decide(request(("k", "v")))
    assert not ok.raw_body and not headers(ok)
    await svc.decide(request(("k", "v")))
    over = await svc.decide(request(("k", "v")))
    body = json.loads(over.raw_body)
    assert body["code"] == 429
    assert body["limits"] == [{"name": "k_limit", "requests_per_unit": 2, "window_seconds": 60}]
    assert body["retry_after_seconds"] in range(1, 61)
    assert headers(over)["content-type"] == "application/json"


async def test_dynamic_metadata_merges_metadata_of_passed_descriptors_first_wins() -> None:
    svc = service(dynamic_metadata=True)
    req = request(("k", "v"), ("ip", "1.1.1.1"))
    req.descriptors[1].hits_addend.value = 3
    resp = await svc.decide(req)
    meta = MessageToDict(resp.dynamic_metadata)
    assert meta["domain"] == "d"
    assert [d["entries"] for d in meta["descriptors"]] == [["k=v"], ["ip=1.1.1.1"]]
    assert meta["descriptors"][1]["hitsAddend"] == 3
    assert meta["metadata"] == {"tier": "gold", "nested": {"a": 1, "b": 2}}


async def test_dynamic_metadata_leaves_out_descriptors_that_are_over() -> None:
    svc = service(dynamic_metadata=True)
    for _ in range(2):
        await svc.decide(request(("k", "v")))
    resp = await svc.decide(request(("k", "v"), ("ip", "2.2.2.2")))
    meta = MessageToDict(resp.dynamic_metadata)
    assert meta["overallCode"] == "OVER_LIMIT"
    assert meta["metadata"] == {"tier": "silver", "nested": {"b": 2}}


@pytest.mark.parametrize("flag", ["response_headers", "dynamic_metadata"])
def test_reference_environment_names_enable_extras(
    flag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rls.cli.main import parser
    from rls.cli.serve import settings_from

    env = {"response_headers": "LIMIT_RESPONSE_HEADERS_ENABLED",
           "dynamic_metadata": "RESPONSE_DYNAMIC_METADATA"}[flag]
    monkeypatch.setenv(env, "true")
    settings = settings_from(parser().parse_args(["serve"]))
    assert getattr(settings, flag) is True


async def test_header_names_come_from_the_reference_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """LIMIT_LIMIT_HEADER / LIMIT_REMAINING_HEADER / LIMIT_RESET_HEADER rename the three
    headers as the reference does; rls's own RateLimit-Policy keeps its name."""
    from rls.cli.main import parser as _parser
    from rls.cli.serve import settings_from as _settings_from

    names = {"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_LIMIT_HEADER": "X-RateLimit-Limit",
             "LIMIT_REMAINING_HEADER": "X-RateLimit-Remaining",
             "LIMIT_RESET_HEADER": "X-RateLimit-Reset"}
    for var, value in names.items():
        monkeypatch.setenv(var, value)
    settings = _settings_from(_parser().parse_args(["serve"]))
    metrics = Metrics()
    config = load_files([("d.yaml", CONFIG)])
    limiter = RateLimiter(lambda: config, MemoryBackend(sweep_interval=0), settings, metrics)
    resp = await RateLimitService(limiter, settings, metrics).decide(request(("k", "v")))
    h = headers(resp)
    assert set(h) == {"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset",
                      "RateLimit-Policy"}
    assert (h["X-RateLimit-Limit"], h["X-RateLimit-Remaining"]) == ("2", "1")
    assert 0 < int(h["X-RateLimit-Reset"]) <= 60
    assert not ignored(names), "/bin/ratelimit reads them too"


@pytest.mark.parametrize("value", ["", "X RateLimit", "RateLimit:Limit", "Ümlaut"])
def test_a_header_name_envoy_would_refuse_is_a_located_error(
    value: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rls.cli.main import parser as _parser
    from rls.cli.serve import settings_from as _settings_from

    monkeypatch.setenv("LIMIT_RESET_HEADER", value)
    with pytest.raises(ValueError, match=r"^LIMIT_RESET_HEADER: .* is not an HTTP header name"):
        _settings_from(_parser().parse_args(["serve"]))
    with pytest.raises(ValueError, match=r"^--limit-header: .* is not an HTTP header name"):
        _settings_from(_parser().parse_args(["serve", "--limit-header", value]))


async def test_limiter_decision_carries_no_metadata_unless_asked() -> None:
    config = load_files([("d.yaml", CONFIG)])
    limiter = RateLimiter(lambda: config, MemoryBackend(sweep_interval=0), Settings(), Metrics())
    decision = await limiter.should_rate_limit("d", [DescriptorIn((("k", "v"),))])
    assert decision.metadata == []


class _Context:
    """What the handler asks of grpc.aio's ServicerContext on a decided call."""

    def time_remaining(self) -> None:
        return None

    async def abort(self, code: object, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")


async def test_a_memoised_request_is_not_decoded_again_with_extras_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The extras read the decoded request: the parse memo keeps it, so a byte-identical
    request (Envoy's usual traffic) is decoded once, not at every call."""
    decoded = 0
    real = rls_pb2.RateLimitRequest

    class Counting:
        @staticmethod
        def FromString(data: bytes) -> rls_pb2.RateLimitRequest:
            nonlocal decoded
            decoded += 1
            return real.FromString(data)

    class Module:
        RateLimitRequest = Counting
        RateLimitResponse = rls_pb2.RateLimitResponse

    monkeypatch.setattr(ratelimit_module, "rls_pb2", Module)
    svc = service(response_headers=True, dynamic_metadata=True)
    data = request(("ip", "10.0.0.1")).SerializeToString()
    answers = [rls_pb2.RateLimitResponse.FromString(await svc.should_rate_limit(data, _Context()))
               for _ in range(3)]
    assert decoded == 1
    assert [headers(a)["RateLimit-Remaining"] for a in answers] == ["9", "8", "7"]
    assert all(a.dynamic_metadata.fields for a in answers)
