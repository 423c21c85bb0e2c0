"""Issue 33: the alert rules on a freshly started rls, evaluated by a real Prometheus.

The failure-mode series start at 0 (issue 25), so a rule that treats "a series Prometheus had
not seen 5 minutes ago" as a failure-mode answer went pending on every healthy start. A fresh
healthy rls must raise no alert at all, while failure-mode answers soon after start (a rise
from the 0 series, or a burst already counted when Prometheus first scrapes) still do.
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import start_redis, wait_until

from .helpers import DOMAIN, run_workload, write_config
from .prom import RULES_FILE, Prometheus, prometheus_binaries, start_prometheus
from .test_prometheus import calls

pytestmark = pytest.mark.slow

FAILURE_ALERT = "RlsFailureModeAnswers"


def _evaluated_after(prom: Prometheus, moment: float) -> bool:
    """Every rule group has been evaluated at least once after `moment` (unix seconds)."""
    groups = prom.get("/api/v1/rules")["groups"]
    return bool(groups) and all(
        _unix(group["lastEvaluation"]) > moment for group in groups
    )


def _unix(rfc3339: str) -> float:
    """Prometheus's RFC 3339 time with nanoseconds, as unix seconds (microsecond precision)."""
    trimmed = re.sub(r"(\.\d{6})\d*", r"\1", rfc3339).replace("Z", "+00:00")
    return datetime.fromisoformat(trimmed).timestamp()


def _alerts(prom: Prometheus) -> list[dict[str, Any]]:
    return list(prom.get("/api/v1/alerts")["alerts"])


def _failure_alerts(prom: Prometheus) -> list[dict[str, Any]]:
    return [a for a in _alerts(prom) if a["labels"]["alertname"] == FAILURE_ALERT
            and a["labels"].get("domain") == DOMAIN]


def _start(rls_factory: Any, tmp_path: Path, redis_url: str) -> Any:
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    write_config(config_dir)
    return rls_factory(config_dir, args=("--redis-url", redis_url, "--failure-mode", "allow",
                                         "--backend-timeout-ms", "50"))


def _prometheus(tmp_path: Path, rls: Any) -> Prometheus:
    prometheus, _ = prometheus_binaries()
    prom_dir = tmp_path / "prometheus"
    prom_dir.mkdir()
    return start_prometheus(prometheus, prom_dir, [f"127.0.0.1:{rls.http_port}"], [RULES_FILE])


def test_a_fresh_healthy_rls_raises_no_alert_and_a_failure_soon_after_start_does(
    rls_factory: Any, tmp_path: Path
) -> None:
    redis = start_redis()
    try:
        rls = _start(rls_factory, tmp_path, redis.url)
        prom = _prometheus(tmp_path, rls)
        try:
            wait_until(lambda: prom.query(
                f'rls_failure_mode_answers_total{{domain="{DOMAIN}"}} == 0'),
                timeout=20, what="the failure-mode series scraped at 0")
            run_workload(rls.grpc_addr)  # healthy traffic, some of it over its limit
            seen = time.time()
            # Several evaluations of every rule over the 0 series and healthy traffic.
            wait_until(lambda: _evaluated_after(prom, seen + 3), timeout=20,
                       what="three rule evaluations after the series were scraped")
            assert _alerts(prom) == []

            # The store goes away a few seconds after start: failure-mode answers must alert.
            redis.stop()
            calls(rls.grpc_addr, 20, "frank")
            wait_until(lambda: _failure_alerts(prom), timeout=20,
                       what="RlsFailureModeAnswers pending after failure-mode answers")
            assert all(float(a["value"]) > 0 for a in _failure_alerts(prom))
        finally:
            prom.stop()
    finally:
        redis.stop()


def test_failure_answers_counted_before_the_first_scrape_still_alert(
    rls_factory: Any, tmp_path: Path
) -> None:
    redis = start_redis()
    try:
        rls = _start(rls_factory, tmp_path, redis.url)
        redis.stop()
        calls(rls.grpc_addr, 20, "frank")  # before Prometheus ever scraped this rls
        prom = _prometheus(tmp_path, rls)
        try:
            wait_until(lambda: _failure_alerts(prom), timeout=20,
                       what="RlsFailureModeAnswers for a burst seen at the first scrape")
            answered = [a for a in _failure_alerts(prom) if float(a["value"]) > 0]
            assert answered, _failure_alerts(prom)
            assert all(float(a["value"]) > 0 for a in _failure_alerts(prom))
        finally:
            prom.stop()
    finally:
        redis.stop()
