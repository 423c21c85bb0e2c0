"""A config file corrupted during hot reload, while calls flow (DESIGN §10: a bad file keeps the
old config, logs `file: message`, bumps a metric; fixing the file reloads).

The file is overwritten in place (as an editor or a careless deploy would) with, in turn: nothing
(a writer that truncated and died), unterminated YAML, and valid YAML with an invalid limit.
Every call meanwhile must still be decided by the old config (its limit is named `v1`); the
fixed file (limit `v2`) must be picked up within a few reload intervals.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from support.faults import (
    KnownBug,
    Load,
    assert_answered_in_time,
    eventually,
    metric,
    report,
    request,
    start_rls,
    summary,
)

pytestmark = pytest.mark.slow

CONFIG = """
domain: cr
descriptors:
  - key: cfg
    rate_limit: {{name: {name}, unit: hour, requests_per_unit: 1000000000}}
"""
V1, V2 = CONFIG.format(name="v1"), CONFIG.format(name="v2")
CORRUPTIONS = [
    # (phase, file text, what the log line says after `<file>: `)
    ("truncated", "", "config file cannot have empty domain"),
    ("bad_yaml", "domain: cr\ndescriptors:\n  - key: cfg\n    rate_limit: {unit: hour, [\n",
     "error loading config file: yaml:"),
    ("bad_limit", CONFIG.format(name="v1").replace("unit: hour", "unit: fortnight"),
     "invalid rate limit unit 'fortnight'"),
]
RELOAD = ("--reload-interval", "0.2")
LOAD = request("cr", "cfg", "x")


def errors(rls) -> float:
    return metric(rls.http_url, "rls_config_loads_total", result="error")


async def test_corrupt_config_keeps_old_config_then_reloads_fixed(rls_factory, tmp_path: Path):
    path = tmp_path / "cr.yaml"
    path.write_text(V1)
    rls = start_rls(rls_factory, path, args=RELOAD)
    v1 = {"decided_ok:v1"}
    allowed = {"v1": v1, "fixing": {"decided_ok:v1", "decided_ok:v2"}, "v2": {"decided_ok:v2"}}
    detected: dict[str, float] = {}
    async with Load(rls.grpc_addr, lambda _: LOAD) as load:
        await load.hold("v1", 0.5)
        for phase, text, message in CORRUPTIONS:
            allowed[phase] = v1
            load.phase = phase
            before = errors(rls)
            path.write_text(text)
            detected[phase] = await asyncio.to_thread(
                eventually, lambda b=before: errors(rls) > b, 5, f"{phase}: error load counted"
            )
            assert f"{path}: {message}" in rls.log(), (phase, rls.log()[-2000:])
            assert metric(rls.http_url, "rls_config_last_load_error", file=str(path)) == 1
            await asyncio.sleep(0.3)  # calls keep flowing on the old config
        load.phase = "fixing"
        fixed_at = load.now()
        path.write_text(V2)
        for _ in range(500):
            call = await load.one(LOAD, probe=True)
            if call.limit_name == "v2":
                break
            await asyncio.sleep(0.01)
        fixed_after = call.start + call.latency - fixed_at
        await load.hold("v2", 0.5)
    numbers = summary(load.calls, allowed)
    numbers.update(
        error_loads=errors(rls),
        success_loads=metric(rls.http_url, "rls_config_loads_total", result="success"),
        error_detected_after_ms={k: round(v * 1000) for k, v in detected.items()},
        fixed_config_used_after_ms=round(fixed_after * 1000),
        last_load_error_after_fix=metric(rls.http_url, "rls_config_last_load_error",
                                         file=str(path)),
    )
    report("config_corrupted_during_reload", numbers)
    assert_answered_in_time(numbers, rls)
    assert numbers["error_loads"] >= len(CORRUPTIONS)
    assert numbers["last_load_error_after_fix"] == 0
    assert fixed_after < 2.0, numbers


async def test_file_the_yaml_library_chokes_on_keeps_reload_alive(rls_factory, tmp_path: Path):
    path = tmp_path / "cr.yaml"
    path.write_text(V1)
    rls = start_rls(rls_factory, path, args=RELOAD)
    problems = []
    async with Load(rls.grpc_addr, lambda _: LOAD) as load:
        await load.hold("v1", 0.3)
        before = errors(rls)
        load.phase = "tagged"
        path.write_text("domain: !!float ;\n")
        try:
            await asyncio.to_thread(eventually, lambda: errors(rls) > before, 3,
                                    "the bad file is counted as an error load")
        except AssertionError as exc:
            problems.append(str(exc))
        load.phase = "fixing"
        path.write_text(V2)
        try:
            await asyncio.to_thread(eventually, lambda: "v2" in rls_http_config(rls), 3,
                                    "the fixed file is loaded")
        except AssertionError as exc:
            problems.append(str(exc))
    assert all(c.kind == "decided_ok" for c in load.calls), summary(load.calls, {})
    rls.proc.send_signal(signal.SIGTERM)
    code = await asyncio.to_thread(rls.proc.wait, 15)
    if code != 0:
        problems.append(f"exit code {code}")
    if problems:
        raise KnownBug("; ".join(problems) + "\n" + rls.log()[-3000:])


def rls_http_config(rls) -> str:
    from conftest import http_get

    return http_get(rls.http_url + "/rlconfig?format=json")[1].decode()


async def test_a_log_file_in_the_config_directory_does_not_feed_the_watcher(
    rls_factory, tmp_path: Path
):
    """rls's log sits next to its config here (as `rls serve --config . 2>> rls.log` would
    have it). watchfiles' own INFO line per change was itself a change of that log: a line
    every 100 ms, forever. rls names the config changes that matter; nothing else is logged."""
    path = tmp_path / "cr.yaml"
    path.write_text(V1)
    rls = start_rls(rls_factory, path, args=RELOAD)
    path.write_text(V2)
    eventually(lambda: rls.log().count("config loaded") >= 2, 20, "the edited config reloaded")
    log = rls.log()
    assert "watchfiles" not in log, log[-2000:]
    assert log.count("config change detected") == 1, log[-2000:]
