"""Config over xDS (CONFIG_TYPE=GRPC_XDS_SOTW): the reference's own scenarios
(xds_sotw_integration_test.go: domains `basic` and `another`, node `init-test-node`, then a
reload by a new snapshot), ACK/NACK, a management server restart, force start and health —
real `rls serve` processes against the in-test ADS server."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from typing import Any

from conftest import http_get
from support.metrics import metric
from support.net import connectable
from support.waiting import wait_until

from .ads_server import AdsServer, domain, limit, pb
from .calls import OK, OVER_LIMIT, decide, health


def basic() -> Any:
    return domain(
        "basic",
        limit("key1", "SECOND", 50),
        limit("key1_local", "SECOND", 50),
        limit("one_per_minute", "MINUTE", 1),
    )


def another() -> Any:
    return domain(
        "another",
        limit("key2", "MINUTE", 20),
        limit("key3", "HOUR", 10),
        limit("key2_local", "MINUTE", 20),
        limit("key3_local", "HOUR", 10),
        limit("key4", "DAY", 20),
        limit("key4_local", "DAY", 20),
    )


def reload_domain() -> Any:
    return domain(
        "reload",
        limit("key1", "SECOND", 50),
        limit("block", "SECOND", 0),
        limit("one_per_minute", "MINUTE", 1),
    )


def rlconfig(rls: Any) -> dict[str, Any]:
    status, body = http_get(rls.http_url + "/rlconfig?format=json")
    assert status == 200, body
    result: dict[str, Any] = json.loads(body)
    return result


def test_reference_scenarios_decide_from_xds_and_reload_by_new_snapshot(
    ads: AdsServer, xds_rls: Callable[..., Any]
) -> None:
    ads.set_snapshot("1", [basic(), another()])
    rls = xds_rls()
    first = ads.wait_ack("1")
    assert first.node.id == "init-test-node"
    assert first.type_url == "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
    assert decide(rls.grpc_addr, "basic", ("one_per_minute", "x")) == OK
    assert decide(rls.grpc_addr, "basic", ("one_per_minute", "x")) == OVER_LIMIT
    assert decide(rls.grpc_addr, "another", ("key2", "v"), hits=20) == OK
    assert decide(rls.grpc_addr, "another", ("key2", "v")) == OVER_LIMIT
    assert decide(rls.grpc_addr, "reload", ("block", "x")) == OK  # no such domain yet

    ads.set_snapshot("2", [basic(), another(), reload_domain()])
    ads.wait_ack("2")
    assert decide(rls.grpc_addr, "reload", ("block", "x")) == OVER_LIMIT
    # counters are untouched by a reload: the minute's one call is still spent
    assert decide(rls.grpc_addr, "basic", ("one_per_minute", "x")) == OVER_LIMIT

    ads.set_snapshot("3", [basic(), another()])
    ads.wait_ack("3")
    assert decide(rls.grpc_addr, "reload", ("block", "x")) == OK
    source = rlconfig(rls)["source"]
    assert source["type"] == "GRPC_XDS_SOTW" and source["version"] == "3"
    assert source["connected"] is True and source["last_nack"] is None
    assert metric(rls.http_url, "rls_xds_config_version_info", version="3") == 1
    assert metric(rls.http_url, "rls_xds_acks_total") == 3
    assert metric(rls.http_url, "rls_config_loads_total", result="success") == 3


def test_node_metadata_and_additional_headers_reach_the_management_server(
    ads: AdsServer, xds_rls: Callable[..., Any]
) -> None:
    ads.set_snapshot("1", [basic()])
    xds_rls(CONFIG_GRPC_XDS_NODE_METADATA="zone:eu-west-1,team=edge",
            CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS="x-api-key:s3cret,X-Tenant:t1,"
            "grpc-timeout:1S,x-sig-bin:raw")
    request = ads.wait_ack("1")
    fields = request.node.metadata.fields
    assert {k: v.string_value for k, v in fields.items()} == {"zone": "eu-west-1", "team": "edge"}
    assert ads.metadata[0]["x-api-key"] == "s3cret" and ads.metadata[0]["x-tenant"] == "t1"
    assert ads.metadata[0]["x-sig-bin"] == "b'raw'" and "grpc-timeout" not in ads.metadata[0]


def test_invalid_set_is_nacked_and_the_last_good_config_stays(
    ads: AdsServer, xds_rls: Callable[..., Any]
) -> None:
    ads.set_snapshot("1", [basic()])
    rls = xds_rls()
    ads.wait_ack("1")
    broken = domain("broken", pb.RateLimitDescriptor(
        key="outer", descriptors=[pb.RateLimitDescriptor(
            key="inner", rate_limit=pb.RateLimitPolicy(requests_per_unit=5))]),
        resource_name="broken-resource")
    ads.set_snapshot("2", [basic(), broken])
    nack = ads.wait_nack()
    assert nack.version_info == "1"  # the last accepted version
    assert nack.error_detail.message == (
        "broken-resource: invalid rate limit unit 'UNKNOWN' (node broken.outer.inner.rate_limit; "
        "valid units: second, minute, hour, day, week, month, year)"
    )
    assert decide(rls.grpc_addr, "basic", ("one_per_minute", "x")) == OK
    assert decide(rls.grpc_addr, "basic", ("one_per_minute", "x")) == OVER_LIMIT
    source = rlconfig(rls)["source"]
    assert source["version"] == "1"
    assert source["last_nack"]["version"] == "2"
    assert source["last_nack"]["error"] == nack.error_detail.message
    assert metric(rls.http_url, "rls_xds_nacks_total", reason="invalid") == 1
    assert metric(rls.http_url, "rls_config_last_load_error", file="xds") == 1
    assert "keeping previous config" in rls.log()

    ads.set_snapshot("3", [basic(), another()])  # a good set clears the error
    ads.wait_ack("3")
    assert metric(rls.http_url, "rls_config_last_load_error", file="xds") == 0


def test_management_server_restart_keeps_the_config_and_reconnects(
    ads: AdsServer, xds_rls: Callable[..., Any]
) -> None:
    ads.set_snapshot("1", [basic()])
    rls = xds_rls()
    ads.wait_ack("1")
    ads.stop()
    wait_until(lambda: metric(rls.http_url, "rls_xds_connected") == 0, 10, "disconnected")
    assert decide(rls.grpc_addr, "basic", ("one_per_minute", "a")) == OK
    assert decide(rls.grpc_addr, "basic", ("one_per_minute", "a")) == OVER_LIMIT

    restarted = AdsServer(port=ads.port)
    restarted.set_snapshot("7", [basic(), reload_domain()])
    restarted.start()
    try:
        restarted.wait_ack("7")
        assert decide(rls.grpc_addr, "reload", ("block", "x")) == OVER_LIMIT
        assert metric(rls.http_url, "rls_xds_connected") == 1
        lost = metric(rls.http_url, "rls_xds_reconnects_total", reason="stream_lost")
        failed = metric(rls.http_url, "rls_xds_reconnects_total", reason="connect_failed")
        assert lost + failed >= 1
    finally:
        restarted.stop()


def test_a_version_is_an_opaque_label_that_a_restarted_control_plane_may_start_again(
    ads: AdsServer, xds_rls: Callable[..., Any]
) -> None:
    """Versions are the control plane's strings, compared for equality only: a restarted
    server numbering from 1 again is a new set applied, shown as version "1" (one series),
    and the gauge's help says the label is opaque."""
    ads.set_snapshot("2", [basic()])
    rls = xds_rls()
    ads.wait_ack("2")
    ads.stop()
    restarted = AdsServer(port=ads.port)
    restarted.set_snapshot("1", [basic(), reload_domain()])
    restarted.start()
    try:
        restarted.wait_ack("1")
        assert decide(rls.grpc_addr, "reload", ("block", "x")) == OVER_LIMIT  # the new set
        assert metric(rls.http_url, "rls_xds_config_version_info", version="1") == 1
        _, body = http_get(rls.http_url + "/metrics")
        series = [line for line in body.decode().splitlines()
                  if line.startswith("rls_xds_config_version_info{")]
        assert series == ['rls_xds_config_version_info{version="1"} 1.0'], series
        help_line = next(line for line in body.decode().splitlines()
                         if line.startswith("# HELP rls_xds_config_version_info "))
        assert "opaque" in help_line, help_line
    finally:
        restarted.stop()


def test_without_force_start_nothing_listens_until_the_first_config(
    ads: AdsServer, xds_rls: Callable[..., Any]
) -> None:
    rls = xds_rls(wait_healthy=False)
    wait_until(lambda: ads.open_streams() == 1, 15, "the xDS stream")
    assert not connectable(rls.http_port) and not connectable(rls.grpc_port)
    assert rls.proc.poll() is None
    ads.set_snapshot("1", [basic()])
    wait_until(lambda: http_get(rls.http_url + "/healthcheck")[0] == 200, 15, "healthy")
    assert decide(rls.grpc_addr, "basic", ("one_per_minute", "x")) == OK


def test_sigterm_before_the_first_config_stops_cleanly_and_closes_the_stream(
    ads: AdsServer, xds_rls: Callable[..., Any]
) -> None:
    """A pod deleted while its controller has not pushed yet: rls is waiting for the first set
    (no force start, a server that never answers); SIGTERM ends it with 0 and a line saying
    so, the stream closed, rather than Python's default death by the signal."""
    rls = xds_rls(wait_healthy=False)
    wait_until(lambda: ads.open_streams() == 1, 15, "the xDS stream")
    rls.proc.send_signal(signal.SIGTERM)
    assert rls.proc.wait(15) == 0, rls.log()
    assert "stopped before the first xDS config arrived" in rls.log()
    assert "Traceback" not in rls.log()
    wait_until(lambda: ads.open_streams() == 0, 10, "the stream closed")


def test_force_start_serves_every_call_ok_while_the_server_is_down_then_picks_config_up(
    ads: AdsServer, xds_rls: Callable[..., Any]
) -> None:
    ads.stop()  # down at start
    rls = xds_rls(FORCE_START_WITHOUT_INITIAL_CONFIG="true")  # healthy without a config
    for _ in range(3):
        assert decide(rls.grpc_addr, "basic", ("one_per_minute", "x")) == OK
    assert rlconfig(rls)["source"]["version"] is None
    assert health(rls.grpc_addr) == "SERVING"  # as the reference's, without a config

    ads.set_snapshot("1", [basic()])
    ads.start()
    ads.wait_ack("1")
    assert decide(rls.grpc_addr, "basic", ("one_per_minute", "y")) == OK
    assert decide(rls.grpc_addr, "basic", ("one_per_minute", "y")) == OVER_LIMIT


def test_healthy_with_at_least_one_config_loaded_holds_health_until_a_domain(
    ads: AdsServer, xds_rls: Callable[..., Any]
) -> None:
    rls = xds_rls(wait_healthy=False, FORCE_START_WITHOUT_INITIAL_CONFIG="true",
                  HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED="true")
    wait_until(lambda: http_get(rls.http_url + "/healthcheck")[0] == 500, 15, "up, unhealthy")
    assert decide(rls.grpc_addr, "basic", ("one_per_minute", "x")) == OK
    assert health(rls.grpc_addr) == "NOT_SERVING"
    ads.set_snapshot("1", [])  # an empty set is accepted, still no domain
    ads.wait_ack("1")
    assert http_get(rls.http_url + "/healthcheck")[0] == 500
    ads.set_snapshot("2", [basic()])
    ads.wait_ack("2")
    wait_until(lambda: http_get(rls.http_url + "/healthcheck")[0] == 200, 10, "healthy")
    wait_until(lambda: health(rls.grpc_addr) == "SERVING", 10, "gRPC health SERVING")


def test_rls_features_work_on_xds_config_rlconfig_top_shadow_and_quota(
    ads: AdsServer, xds_rls: Callable[..., Any]
) -> None:
    tier = pb.RateLimitDescriptor(
        key="tier", value="gold", shadow_mode=True, detailed_metric=True,
        rate_limit=pb.RateLimitPolicy(unit=pb.HOUR, requests_per_unit=1, name="gold-hourly"),
    )
    tier.metadata.update({"plan": "gold"})
    quota = pb.RateLimitDescriptor(key="tokens", quota_mode=True, rate_limit=pb.RateLimitPolicy(
        unit=pb.WEEK, requests_per_unit=2))
    ads.set_snapshot("1", [domain("features", tier, quota, limit("user", "HOUR", 1))])
    rls = xds_rls(RESPONSE_DYNAMIC_METADATA="true")
    ads.wait_ack("1")
    status, text = http_get(rls.http_url + "/rlconfig")
    assert status == 200
    assert text.decode().splitlines() == [
        "features.tier_gold: unit=HOUR requests_per_unit=1, shadow_mode: true, "
        "quota_mode: false, name: gold-hourly",
        "features.tokens: unit=WEEK requests_per_unit=2, shadow_mode: false, quota_mode: true",
        "features.user: unit=HOUR requests_per_unit=1, shadow_mode: false, quota_mode: false",
    ]
    for _ in range(2):  # over its limit, but in shadow mode: answered OK
        assert decide(rls.grpc_addr, "features", ("tier", "gold")) == OK
    assert decide(rls.grpc_addr, "features", ("user", "mallory")) == OK
    assert decide(rls.grpc_addr, "features", ("user", "mallory")) == OVER_LIMIT
    wait_until(lambda: "mallory" in http_get(rls.http_url + "/top?domain=features")[1].decode(),
               10, "the over-limit caller in /top (rls top)")


def test_each_worker_holds_its_own_stream(
    ads: AdsServer, xds_rls: Callable[..., Any], redis_url: str
) -> None:
    ads.set_snapshot("1", [basic()])
    rls = xds_rls(args=("--workers", "2", "--redis-url", redis_url))
    wait_until(lambda: len(ads.acks("1")) == 2, 30, "both workers' ACKs")
    assert decide(rls.grpc_addr, "basic", ("one_per_minute", "w")) == OK
    assert decide(rls.grpc_addr, "basic", ("one_per_minute", "w")) == OVER_LIMIT
