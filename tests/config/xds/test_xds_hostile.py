"""Hostile or broken management servers never hurt decisions: each response is NACKed or
bounded, the config in force keeps deciding, and rls never logs a traceback."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2
from support.metrics import metric
from support.waiting import wait_until

from rls.config.xds.convert import TYPE_URL

from .ads_server import AdsServer, domain, limit, pb
from .calls import OK, OVER_LIMIT, decide
from .test_xds_config import another, basic


def started(ads: AdsServer, xds_rls: Callable[..., Any], **env: str) -> Any:
    """rls on `ads` with `basic` (version 1) in force."""
    ads.set_snapshot("1", [basic()])
    rls = xds_rls(**env)
    ads.wait_ack("1")
    return rls


def still_decides(rls: Any, value: str) -> None:
    assert decide(rls.grpc_addr, "basic", ("one_per_minute", value)) == OK
    assert decide(rls.grpc_addr, "basic", ("one_per_minute", value)) == OVER_LIMIT
    assert "Traceback" not in rls.log()


def nested(depth: int) -> Any:
    node = limit("leaf", "SECOND", 1)
    for level in range(depth - 1):
        node = pb.RateLimitDescriptor(key=f"k{level}", descriptors=[node])
    return domain("deep", node)


def test_garbage_in_an_any_is_nacked_as_undecodable(
    ads: AdsServer, xds_rls: Callable[..., Any]
) -> None:
    rls = started(ads, xds_rls)
    garbage = any_pb2.Any(type_url=TYPE_URL, value=b"\xff\xff\xff\xff\x0f garbage")
    ads.set_snapshot("2", [basic(), garbage])
    nack = ads.wait_nack()
    assert nack.error_detail.message.startswith("resource[1]: cannot decode RateLimitConfig")
    assert metric(rls.http_url, "rls_xds_nacks_total", reason="decode") == 1
    still_decides(rls, "garbage")


def test_a_wrong_type_in_the_any_or_the_response_is_nacked(
    ads: AdsServer, xds_rls: Callable[..., Any]
) -> None:
    rls = started(ads, xds_rls)
    wrong = any_pb2.Any()
    wrong.Pack(discovery_pb2.DiscoveryRequest(version_info="x"))
    ads.set_snapshot("2", [wrong])
    assert "unexpected type_url 'type.googleapis.com/envoy.service.discovery.v3" in (
        ads.wait_nack().error_detail.message
    )
    ads.push_raw(discovery_pb2.DiscoveryResponse(
        version_info="3", type_url="type.googleapis.com/envoy.config.cluster.v3.Cluster"))
    assert "unexpected type_url" in ads.wait_nack(2).error_detail.message
    assert metric(rls.http_url, "rls_xds_nacks_total", reason="type_url") == 2
    still_decides(rls, "wrong-type")


def test_a_response_over_the_size_cap_ends_the_stream_and_the_config_stays(
    ads: AdsServer, xds_rls: Callable[..., Any]
) -> None:
    rls = started(ads, xds_rls, XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES="65536")
    big = domain("big", *[limit(f"key{i:05d}" + "x" * 40, "SECOND", 5) for i in range(2000)])
    ads.set_snapshot("2", [basic(), big])
    wait_until(lambda: metric(rls.http_url, "rls_xds_reconnects_total",
                              reason="response_too_large") >= 1, 15, "the stream refused")
    still_decides(rls, "too-large")
    assert not ads.acks("2")
    ads.set_snapshot("3", [basic()])  # a server that recovers is followed again
    ads.wait_ack("3")


def test_descriptor_trees_too_deep_and_duplicate_domains_are_nacked(
    ads: AdsServer, xds_rls: Callable[..., Any]
) -> None:
    rls = started(ads, xds_rls)
    ads.set_snapshot("2", [basic(), nested(100)])
    first = ads.wait_nack().error_detail.message
    assert "nested deeper than 64" in first or "cannot decode" in first
    ads.set_snapshot("3", [basic(), nested(70)])
    assert "deep: config error, descriptors nested deeper than 64" in (
        ads.wait_nack(2).error_detail.message
    )
    ads.set_snapshot("4", [basic(), domain("basic", limit("x", "SECOND", 1),
                                           resource_name="basic-again")])
    assert ads.wait_nack(3).error_detail.message == (
        "basic-again: duplicate domain 'basic' in config file"
    )
    still_decides(rls, "deep")


def test_ten_thousand_domains_are_applied_off_the_loop(
    ads: AdsServer, xds_rls: Callable[..., Any]
) -> None:
    rls = started(ads, xds_rls)
    many = [domain(f"d{i:05d}", limit("key", "MINUTE", 1)) for i in range(10_000)]
    ads.set_snapshot("2", [basic(), *many])
    ads.wait_ack("2", timeout=120)
    assert decide(rls.grpc_addr, "d09999", ("key", "v")) == OK
    assert decide(rls.grpc_addr, "d09999", ("key", "v")) == OVER_LIMIT
    still_decides(rls, "many")


def test_a_refused_set_sent_again_is_nacked_again_without_a_rebuild(
    ads: AdsServer, xds_rls: Callable[..., Any]
) -> None:
    """A broken controller that keeps resending the set rls refused (new versions, new
    nonces) costs one build and one error line, not one per response: every repeat is NACKed
    with the same detail at once, so a refused 10,000-domain set cannot keep the builds (and
    the decisions' p99 that builds cost) going for as long as the server insists."""
    rls = started(ads, xds_rls)
    duplicate = domain("basic", limit("other", "SECOND", 1), resource_name="dupe")
    for version in ("2", "3", "4"):
        ads.set_snapshot(version, [basic(), duplicate])
    third = ads.wait_nack(3)
    assert third.version_info == "1" and third.response_nonce
    assert {n.error_detail.message for n in ads.nacks()} == {
        "dupe: duplicate domain 'basic' in config file"}
    assert rls.log().count("error loading new configuration") == 1
    assert metric(rls.http_url, "rls_xds_nacks_total", reason="invalid") == 3
    ads.set_snapshot("5", [basic(), another()])
    ads.wait_ack("5")
    ads.set_snapshot("6", [basic(), duplicate])  # refused again after a good set: said again
    ads.wait_nack(4)
    wait_until(lambda: rls.log().count("error loading new configuration") == 2, 10,
               "the refusal logged again")
    still_decides(rls, "repeat")


def test_the_set_in_force_sent_again_after_a_refusal_clears_the_error(
    ads: AdsServer, xds_rls: Callable[..., Any]
) -> None:
    """A controller that goes back to the set rls already runs (a refused push rolled back)
    leaves no refusal standing: the error gauge falls to 0, /rlconfig shows no error."""
    rls = started(ads, xds_rls)
    ads.set_snapshot("2", [basic(), domain("basic", limit("other", "SECOND", 1),
                                          resource_name="dupe")])
    ads.wait_nack(1)
    assert metric(rls.http_url, "rls_config_last_load_error", file="xds") == 1
    ads.set_snapshot("3", [basic()])  # the set in force, as version 1 sent it
    ads.wait_ack("3")
    assert metric(rls.http_url, "rls_config_last_load_error", file="xds") == 0


def test_a_server_that_never_answers_leaves_a_force_started_rls_serving(
    ads: AdsServer, xds_rls: Callable[..., Any]
) -> None:
    ads.silent = True
    ads.set_snapshot("1", [basic()])
    rls = xds_rls(FORCE_START_WITHOUT_INITIAL_CONFIG="true")
    wait_until(lambda: metric(rls.http_url, "rls_xds_connected") == 1, 15, "stream open")
    for _ in range(3):
        assert decide(rls.grpc_addr, "basic", ("one_per_minute", "x")) == OK
    assert ads.sent == 0 and not ads.nacks()
    assert "Traceback" not in rls.log()


def test_a_server_answering_a_hundred_times_a_second_is_followed_with_bounded_memory(
    ads: AdsServer, xds_rls: Callable[..., Any]
) -> None:
    rls = started(ads, xds_rls)
    stop = threading.Event()

    def flood() -> None:
        version = 1
        while not stop.is_set():
            version += 1
            extra = domain(f"flood{version % 7}", limit("key", "SECOND", version % 50 + 1))
            ads.set_snapshot(str(version), [basic(), extra])
            time.sleep(0.01)

    rss_before = rss_kib(rls.proc.pid)
    pusher = threading.Thread(target=flood, daemon=True)
    pusher.start()
    try:
        deadline, calls = time.monotonic() + 4, 0
        while time.monotonic() < deadline:
            calls += 1  # a value of its own per call: key1 allows 50 a second per value
            assert decide(rls.grpc_addr, "basic", ("key1", f"flood{calls}")) == OK
    finally:
        stop.set()
        pusher.join()
    ads.set_snapshot("final", [basic()])
    ads.wait_ack("final", timeout=30)
    assert metric(rls.http_url, "rls_xds_acks_total") >= 50  # each one built and swapped in
    assert rss_kib(rls.proc.pid) - rss_before < 64 * 1024
    still_decides(rls, "flood")


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")
