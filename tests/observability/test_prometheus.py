"""The dashboard and the alert rules against a real Prometheus scraping a real rls.

One rls (Redis counters, response cache on the same Redis) runs a short story while Prometheus
scrapes it every second: calls within, near and over their limits; cache misses then hits; a
Redis pause (CLIENT PAUSE) that makes calls wait out their budget (slow decisions, failure-mode
answers); a broken descriptor file (reload error); then Redis dies (breaker open, failure-mode
answers, cache store errors). Then every expression of every dashboard panel and every alert
rule is evaluated through Prometheus's HTTP API and must return data — a panel that can never
show anything or a metric name that does not exist fails here — and Prometheus's own rule
evaluation must be healthy with every alert pending or firing.
"""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from conftest import http_get, start_redis, wait_until
from envoy.service.ratelimit.v3 import rls_pb2_grpc
from support.calls import descriptor, request

from .helpers import DOMAIN, run_workload, write_config
from .prom import (
    DASHBOARD_FILE,
    RULES_FILE,
    cache_get,
    prometheus_binaries,
    start_prometheus,
)

pytestmark = pytest.mark.slow

CACHE_RULES = """
store_timeout_ms: 50
coalesce_wait_ms: 0
version_cache_ms: 0
rules:
- api: items
  methods: [GET]
  key: {query: true}
  ttl: 60
  max_entry_bytes: 1000
"""


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target; Grafana's $__rate_interval becomes 1m."""
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    out = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            out.append((panel["title"], target["expr"].replace("$__rate_interval", "1m")))
    return out


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def calls(
    addr: str, count: int, user: str, parallel: int = 1, deadline: float | None = 10
) -> None:
    """`count` calls for one user of the test domain, `parallel` at a time on one channel;
    `deadline` is the caller's gRPC deadline (rls keeps within it)."""
    with grpc.insecure_channel(addr) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)

        def one(_: int) -> None:
            stub.ShouldRateLimit(request(DOMAIN, descriptor(("user", user))),
                                timeout=deadline)

        with ThreadPoolExecutor(parallel) as pool:
            list(pool.map(one, range(count)))


def test_promtool_accepts_the_alert_rules():
    _, promtool = prometheus_binaries()
    done = subprocess.run([promtool, "check", "rules", str(RULES_FILE)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in done.stdout


def test_every_panel_and_alert_returns_data_from_prometheus_scraping_rls(
    rls_factory, tmp_path: Path
):
    prometheus, _ = prometheus_binaries()
    redis = start_redis()
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    write_config(config_dir)
    cache_path = tmp_path / "cache.yaml"
    cache_path.write_text(CACHE_RULES)
    try:
        rls = rls_factory(
            config_dir,
            args=("--redis-url", redis.url, "--cache-config", str(cache_path),
                  "--cache-store", redis.url, "--reload-interval", "0.2",
                  "--failure-mode", "allow", "--backend-timeout-ms", "50"),
        )
        prom_dir = tmp_path / "prometheus"
        prom_dir.mkdir()
        prom = start_prometheus(prometheus, prom_dir, [f"127.0.0.1:{rls.http_port}"],
                                [RULES_FILE])
        try:
            wait_until(lambda: prom.query('up{job="rls"} == 1'), timeout=20,
                       what="prometheus scraping rls")
            _story(rls, redis, prom)
            try:
                _assert_everything_has_data(prom)
            except AssertionError as exc:
                metrics = http_get(rls.http_url + "/metrics")[1].decode()
                raise AssertionError(
                    f"{exc}\n--- rls /metrics ---\n{metrics}\n--- rls log ---\n{rls.log()[-4000:]}"
                ) from None
        finally:
            prom.stop()
    finally:
        redis.stop()


def _story(rls: Any, redis: Any, prom: Any) -> None:
    # Within, near and over limits (known workload), and cache misses then hits. The limit's
    # series are scraped once at 0 first, so the first near hits are a rise Prometheus sees.
    calls(rls.grpc_addr, 1, "warm-up")
    wait_until(lambda: prom.query('rls_limit_near_limit_total{key="obs.user"} == 0'),
               timeout=10, what="the limit's series scraped at 0")
    run_workload(rls.grpc_addr)
    for page in range(3):
        assert cache_get(rls.extproc_addr, "items", f"/items?page={page}") == "miss"
    for page in range(3):
        wait_until(lambda p=page: cache_get(rls.extproc_addr, "items", f"/items?page={p}") == "hit",
                   timeout=5, what="a cache hit after the miss was stored")

    # Redis stalls for 1.5 s: calls without a caller deadline wait out rls's 50 ms store budget
    # (slow decisions, store_slow answers). The pause ends by itself, so nothing hangs.
    redis.client().execute_command("CLIENT", "PAUSE", "1500", "ALL")
    calls(rls.grpc_addr, 20, "erin", parallel=10, deadline=None)

    # A broken descriptor file: the old config stays, the reload error is exported.
    (Path(rls.log_path).parent / "config" / "broken.yaml").write_text("domain: [unclosed\n")
    wait_until(lambda: b"rls_config_last_load_error{" in http_get(rls.http_url + "/metrics")[1]
               and b'} 1.0' in http_get(rls.http_url + "/metrics")[1],
               timeout=10, what="the reload error in /metrics")

    # Redis dies: breaker open, failure-mode answers, cache store errors.
    redis.stop()
    calls(rls.grpc_addr, 20, "frank")
    for page in range(5):
        assert cache_get(rls.extproc_addr, "items", f"/items?page=x{page}") == "upstream"


def _assert_everything_has_data(prom: Any) -> None:
    rules = alert_rules()
    # Wait for scrapes after the story's last step, then for rule evaluation to catch up.
    silent: list[str] = []

    def every_alert_holds() -> bool:
        silent[:] = [rule["alert"] for rule in rules if not prom.query(rule["expr"])]
        return not silent

    try:
        wait_until(every_alert_holds, timeout=20, what="every alert expression to hold")
    except TimeoutError:
        raise AssertionError(f"alert expressions without data: {silent}") from None

    # rate() needs two samples of a series: a series born in the story's last second shows
    # up one scrape later.
    empty: list[tuple[str, str]] = []

    def every_panel_has_data() -> bool:
        empty[:] = [(title, expr) for title, expr in dashboard_exprs() if not prom.query(expr)]
        return not empty

    try:
        wait_until(every_panel_has_data, timeout=15, what="every dashboard panel to have data")
    except TimeoutError:
        raise AssertionError(f"dashboard panels without data: {empty}") from None

    def alert_states() -> dict[str, str]:
        data = prom.get("/api/v1/rules")
        out = {}
        for group in data["groups"]:
            for rule in group["rules"]:
                assert rule["health"] == "ok", rule
                out[rule["name"]] = rule["state"]
        return out

    states: dict[str, str] = {}

    def all_active() -> bool:
        states.update(alert_states())
        return len(states) == len(rules) and all(
            s in ("pending", "firing") for s in states.values()
        )

    try:
        wait_until(all_active, timeout=10, what="every alert pending or firing")
    except TimeoutError:
        raise AssertionError(f"alert states: {states}") from None
