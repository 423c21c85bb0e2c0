"""Issue 25 item 2: a domain that matches no config file is answered OK, but never silently.

Each unknown domain is logged with its name once per minute and counted in
rls_domain_not_found_total{domain} under a bounded label (the name when short and printable,
for the first MAX_NAMED names, then `_other`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest
from conftest import http_get
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from rls.engine.unknown_domains import LOG_EVERY_S, MAX_NAME_CHARS, MAX_NAMED, UnknownDomains
from rls.observability.metrics import Metrics


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def count(metrics: Metrics, domain: str) -> float | None:
    return metrics.registry.get_sample_value("rls_domain_not_found_total", {"domain": domain})


def test_unknown_domain_is_counted_under_its_name_and_logged_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics, clock = Metrics(), Clock()
    unknown = UnknownDomains(metrics.domain_not_found, clock)
    with caplog.at_level(logging.INFO, logger="rls.limiter"):
        for _ in range(5):
            unknown.report("ratelimt", 2, ["ratelimit"])
        clock.now += LOG_EVERY_S - 1
        unknown.report("ratelimt", 1, ["ratelimit"])
        unknown.report("other", 1, ["ratelimit"])
    lines = [r.getMessage() for r in caplog.records]
    assert len([x for x in lines if "'ratelimt'" in x]) == 1, lines
    assert len([x for x in lines if "'other'" in x]) == 1, lines
    assert "configured domains: ratelimit" in lines[0]
    assert 'rls_domain_not_found_total{domain="ratelimt"}' in lines[0]
    assert count(metrics, "ratelimt") == 11
    assert count(metrics, "other") == 1
    caplog.clear()
    clock.now += 1
    with caplog.at_level(logging.INFO, logger="rls.limiter"):
        unknown.report("ratelimt", 1)
    assert len(caplog.records) == 1  # a minute later: logged again


def test_labels_are_bounded_long_unprintable_and_extra_names_go_to_other() -> None:
    metrics = Metrics()
    unknown = UnknownDomains(metrics.domain_not_found, Clock())
    unknown.report("x" * (MAX_NAME_CHARS + 1), 1)
    unknown.report("bad\nname", 1)
    for i in range(MAX_NAMED + 20):
        unknown.report(f"d{i}", 1)
    assert count(metrics, "x" * (MAX_NAME_CHARS + 1)) is None
    assert count(metrics, "bad\nname") is None
    assert count(metrics, f"d{MAX_NAMED - 1}") == 1
    assert count(metrics, f"d{MAX_NAMED}") is None
    assert count(metrics, "_other") == 2 + 20
    unknown.report("d0", 1)  # a name with a series keeps it
    assert count(metrics, "d0") == 2
    text = metrics.exposition().decode()
    assert text.count("rls_domain_not_found_total{") == MAX_NAMED + 1


def test_a_served_unknown_domain_is_logged_and_counted_by_name(
    rls_factory, tmp_path: Path
) -> None:
    cfg = tmp_path / "d.yaml"
    cfg.write_text("domain: ratelimit\ndescriptors:\n  - key: k\n"
                   "    rate_limit: {unit: minute, requests_per_unit: 1}\n")
    proc = rls_factory(cfg)
    with grpc.insecure_channel(f"127.0.0.1:{proc.grpc_port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="k", value="v")
        request = rls_pb2.RateLimitRequest(
            domain="ratelimt", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])]
        )
        for _ in range(3):
            answer = stub.ShouldRateLimit(request, timeout=5)
            assert answer.overall_code == rls_pb2.RateLimitResponse.OK
    status, raw = http_get(proc.http_url + "/metrics")
    body = raw.decode()
    assert status == 200
    assert 'rls_domain_not_found_total{domain="ratelimt"} 3.0' in body
    log = proc.log()
    assert log.count("domain 'ratelimt' matches no config file's domain") == 1, log
    assert "configured domains: ratelimit" in log
