"""/metrics of a real `rls serve` (README "Admin API" metrics list), parsed with
prometheus_client's parser: every documented family is there and moves when it should; per-limit
series stay bounded by the config."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from conftest import free_port, http_get, wait_until
from support.calls import (
    OK,
    OVER,
    Grpc,
    delta,
    descriptor,
    has,
    http,
    names,
    scrape,
    series,
    uid,
    value,
)

from rls import __version__

DOCUMENTED = {
    "rls_requests_total",
    "rls_limit_total_hits_total",
    "rls_limit_within_limit_total",
    "rls_limit_near_limit_total",
    "rls_limit_over_limit_total",
    "rls_limit_shadow_mode_total",
    "rls_decision_seconds_bucket",
    "rls_decision_seconds_count",
    "rls_decision_seconds_sum",
    "rls_backend_roundtrips_total",
    "rls_backend_errors_total",
    "rls_fallback_decisions_total",
    "rls_config_loads_total",
    "rls_switch",
    "rls_global_shadow_mode_total",
    "rls_request_errors_total",
    "rls_domain_not_found_total",
    "rls_build_info",
}


def test_families_are_present_and_move(srv):
    before = scrape(srv.http_url)
    t = uid()
    with Grpc(srv.grpc_addr) as client:
        # Three requests of three descriptors each (four limits: `multi` has two).
        for _ in range(3):
            resp = client.call(
                "ops",
                descriptor(("k", uid())),
                descriptor(("multi", uid())),
                descriptor(("big", uid())),
            )
            assert resp.overall_code == OK
        codes = [client.one("ops", ("two", t)).overall_code for _ in range(4)]
        assert codes == [OK, OK, OVER, OVER]
        client.one("no-such-domain", ("k", "v"))
        with pytest.raises(grpc.RpcError) as err:
            client.one("", ("k", "v"))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    after = scrape(srv.http_url)

    expected = set(DOCUMENTED)
    if srv.backend == "redis":  # the local over-limit cache and the breaker are Redis-only
        expected |= {"rls_backend_circuit_open", "rls_limit_over_limit_with_local_cache_total"}
    missing = expected - names(after)
    assert not missing, f"{srv.backend}: families missing from /metrics: {sorted(missing)}"
    assert value(after, "rls_build_info", version=__version__) == 1
    assert value(after, "rls_config_loads_total", result="success") >= 1

    assert delta(before, after, "rls_requests_total", domain="ops", code="OK") == 5
    assert delta(before, after, "rls_requests_total", domain="ops", code="OVER_LIMIT") == 2
    assert delta(before, after, "rls_domain_not_found_total", domain="no-such-domain") == 1
    assert delta(before, after, "rls_request_errors_total", reason="invalid_argument") == 1
    assert [
        delta(before, after, f"rls_limit_{kind}_total", key="ops.two")
        for kind in ("total_hits", "within_limit", "near_limit", "over_limit")
    ] == [4, 2, 1, 2]  # limit 2: the second hit is past 80 % (near), then two over
    assert delta(before, after, "rls_limit_total_hits_total", key="ops.k") == 3
    assert delta(before, after, "rls_limit_total_hits_total", key="ops.big") == 3
    # Two limits on one node: a series each (`rate_limits:` keys carry the window).
    assert delta(before, after, "rls_limit_total_hits_total", key="ops.multi.1second") == 3
    assert delta(before, after, "rls_limit_total_hits_total", key="ops.multi.1day") == 3
    # The decision histogram saw every decided gRPC call; its buckets are cumulative.
    calls = 3 + 4 + 1
    assert delta(before, after, "rls_decision_seconds_count") == calls
    assert delta(before, after, "rls_decision_seconds_bucket", le="+Inf") == calls
    assert delta(before, after, "rls_decision_seconds_sum") > 0
    buckets = sorted(
        (float(s["le"]), value(after, "rls_decision_seconds_bucket", **s))
        for s in series(after, "rls_decision_seconds_bucket")
    )
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)

    if srv.backend == "redis":
        # One round trip per request whatever its number of descriptors: 3, then the three
        # `two` calls up to the first OVER_LIMIT; the fourth comes from the local cache.
        assert delta(before, after, "rls_backend_roundtrips_total", backend="redis") == 6
        assert delta(before, after, "rls_limit_over_limit_with_local_cache_total",
                     key="ops.two") == 1
        assert value(after, "rls_backend_circuit_open", backend="redis") == 0
        assert delta(before, after, "rls_backend_errors_total", backend="redis",
                     failure_mode="allow") == 0


def test_backend_errors_and_circuit_breaker(spawner, tmp_path: Path):
    config = tmp_path / "dead.yaml"
    config.write_text(
        """
domain: open
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 5}
"""
    )
    (tmp_path / "closed.yaml").write_text(
        """
domain: closed
failure_mode: deny
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 5}
"""
    )
    dead = f"redis://127.0.0.1:{free_port()}/0"
    srv = spawner(config, tmp_path / "closed.yaml", args=("--redis-url", dead),
                  wait_healthy=False)
    wait_until(lambda: "not ready: redis not reachable" in srv.log(), timeout=30,
               what="the unreachable store logged")
    # Not ready without its store (the admin listener opens right after the first attempt).
    wait_until(lambda: http_get(srv.http_url + "/healthcheck")[0] == 500, timeout=30,
               what="/healthcheck answering 500")
    before = scrape(srv.http_url)
    # The store never answered: the breaker is open from the start, calls fail at once.
    assert value(before, "rls_backend_circuit_open", backend="redis") == 1
    with Grpc(srv.grpc_addr) as client:
        started = time.monotonic()
        codes = [client.one("open", ("k", uid())).overall_code for _ in range(5)]
        elapsed = time.monotonic() - started
        denied = client.one("closed", ("k", uid())).overall_code
    assert codes == [OK] * 5  # --failure-mode allow (default)
    assert denied == OVER  # the domain's failure_mode: deny
    assert elapsed < 5, f"5 calls against a dead Redis took {elapsed:.1f} s"
    after = scrape(srv.http_url)
    errors = delta(before, after, "rls_backend_errors_total", backend="redis",
                   failure_mode="allow")
    assert errors == 6, f"6 calls failed over to the failure mode, {errors} counted"
    # Who answered instead of the store, why, per domain.
    assert delta(before, after, "rls_failure_mode_answers_total", domain="open",
                 reason="store_down", answer="allow") == 5
    assert delta(before, after, "rls_failure_mode_answers_total", domain="closed",
                 reason="store_down", answer="deny") == 1
    assert value(after, "rls_backend_circuit_open", backend="redis") == 1
    assert "backend redis failed" in srv.log()
    # A counter query cannot be answered either: a clean error, not a crash.
    status, payload = http(
        srv.http_url, "POST", "/counters",
        {"domain": "open", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]},
    )
    assert status == 503, f"POST /counters with Redis down: HTTP {status} {payload}"


@pytest.mark.parametrize("srv", ["memory"], indirect=True)  # reloading ignores the backend
def test_config_load_error_is_reported_per_file(srv, shared_config: Path):
    broken = shared_config / "zz-broken.yaml"
    before = scrape(srv.http_url)
    broken.write_text("domain: broken\ndescriptors:\n  - key: k\n    nosuchfield: 1\n")
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            samples = scrape(srv.http_url)
            if value(samples, "rls_config_last_load_error", file=str(broken)) == 1:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(
                "rls_config_last_load_error{file=zz-broken.yaml} never became 1: "
                f"{series(samples, 'rls_config_last_load_error')}"
            )
        assert delta(before, samples, "rls_config_loads_total", result="error") >= 1
        # The previous config keeps serving.
        with Grpc(srv.grpc_addr) as client:
            assert client.one("ops", ("two", uid())).statuses[0].limit_remaining == 1
        assert f"{broken}:" in srv.log()
    finally:
        broken.unlink()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        samples = scrape(srv.http_url)
        if delta(before, samples, "rls_config_loads_total", result="success") >= 1:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the fixed config was never reloaded")
    assert value(samples, "rls_config_last_load_error", file=str(broken)) == 0


def test_config_load_error_clears_with_workers(workers_srv):
    """With --workers (prometheus multiprocess mode) the per-file error gauge must clear too."""
    srv = workers_srv
    broken = srv.config_dir / "zz-broken.yaml"
    before = scrape(srv.http_url)

    def poll(done, what: str):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            samples = scrape(srv.http_url)
            if done(samples):
                return samples
            time.sleep(0.1)
        raise AssertionError(f"{what}: {series(samples, 'rls_config_last_load_error')}")

    broken.write_text("domain: broken\ndescriptors:\n  - key: k\n    nosuchfield: 1\n")
    try:
        poll(lambda s: delta(before, s, "rls_config_loads_total", result="error") >= 2
             and value(s, "rls_config_last_load_error", file=str(broken)) == 1,
             "both workers never reported the broken file")
    finally:
        broken.unlink()
    poll(lambda s: delta(before, s, "rls_config_loads_total", result="success") >= 2,
         "both workers never reloaded the fixed config")
    time.sleep(0.5)  # a scrape or two later
    fixed = scrape(srv.http_url)
    assert value(fixed, "rls_config_last_load_error", file=str(broken)) == 0, (
        "rls_config_last_load_error stays 1 after every worker reloaded the fixed config: "
        f"{series(fixed, 'rls_config_last_load_error')}"
    )


def test_per_limit_series_do_not_grow_with_request_values(srv):
    run = uid()
    users = [f"{run}-{i}" for i in range(200)]
    before = scrape(srv.http_url)
    with Grpc(srv.grpc_addr) as client:
        for user in users:
            assert client.one("ops", ("user", user)).overall_code == OK
            assert client.one("ops", ("duser", user)).overall_code == OK
    after = scrape(srv.http_url)
    # Default key: one series per limit, no request value in any label.
    user_keys = {s["key"] for s in series(after, "rls_limit_total_hits_total")
                 if s["key"].startswith("ops.user")}
    assert user_keys == {"ops.user"}
    assert delta(before, after, "rls_limit_total_hits_total", key="ops.user") == 200
    leaked = [
        (name, dict(labels))
        for (name, labels) in after
        if any(run in v for _, v in labels) and not dict(labels).get("key", "").startswith(
            "ops.duser_"
        )
    ]
    assert not leaked, leaked[:5]
    # detailed_metric opts in: one series per value.
    detailed = {s["key"] for s in series(after, "rls_limit_total_hits_total")
                if run in s["key"]}
    assert detailed == {f"ops.duser_{u}" for u in users}
    assert not has(after, "rls_limit_total_hits_total", key="ops.duser") or delta(
        before, after, "rls_limit_total_hits_total", key="ops.duser"
    ) == 0
