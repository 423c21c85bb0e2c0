"""Issue 18 item 5: a CLI and logs an operator can use.

`rls --version`; defaults and env names in `--help`; `--token` and one error style for the
admin clients (non-zero exit on HTTP errors, bad `--day` refused); `-d` values with commas;
debug lines saying what a descriptor matched; a worker label on every line under --workers;
a line saying the admin token is on; distinct metric keys for several limits on one node.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from conftest import wait_until
from support.rls_cli import rls

from rls.cli.counters import parse_descriptor
from rls.cli.serve import FLAGS
from rls.config.loader import load_files
from rls.config.matcher import match

CONFIG = """domain: ops
descriptors:
  - key: k
    rate_limits:
      - {unit: second, requests_per_unit: 10}
      - {unit: day, requests_per_unit: 10000}
  - key: named
    rate_limits:
      - {name: burst, unit: second, requests_per_unit: 5}
      - {name: daily, unit: day, requests_per_unit: 50}
"""


@pytest.mark.process
def test_version() -> None:
    done = rls("--version")
    assert done.returncode == 0
    assert re.fullmatch(r"rls \d+\.\d+\.\d+\S*\n", done.stdout), done.stdout


@pytest.mark.process
def test_serve_help_gives_default_and_env_name_of_every_flag() -> None:
    text = " ".join(rls("serve", "--help").stdout.split())
    for name in FLAGS:
        flag = "--" + name.replace("_", "-")
        assert re.search(rf"{flag}\b.*?\(default [^;]*; env RLS_{name.upper()}\b", text), flag
    assert "(default 0.0.0.0:8081; env RLS_GRPC_ADDR)" in text
    assert "env RLS_REDIS_URL or REDIS_URL" in text


@pytest.mark.process
@pytest.mark.parametrize("command", ["counters", "usage", "switches"])
def test_admin_clients_help_names_token_and_admin_url_env(command: str) -> None:
    text = " ".join(rls(command, "--help").stdout.split())
    assert "--token" in text and "RLS_ADMIN_TOKEN" in text
    assert "default http://127.0.0.1:8080; env RLS_ADMIN_URL" in text


@pytest.mark.process
def test_bad_day_is_refused_with_rc_2() -> None:
    done = rls("usage", "--domain", "d", "--day", "2024-13-01")
    assert done.returncode == 2
    assert "YYYYMMDD" in done.stderr


def test_descriptor_values_may_contain_commas() -> None:
    assert parse_descriptor(r"path=/a\,b,user=x") == {
        "entries": [{"key": "path", "value": "/a,b"}, {"key": "user", "value": "x"}]
    }
    assert parse_descriptor("tags=a,b,app=1")["entries"] == [
        {"key": "tags", "value": "a,b"}, {"key": "app", "value": "1"}
    ]
    with pytest.raises(ValueError):
        parse_descriptor("novalue")


def test_admin_clients_token_flag_401_hint_and_error_style(rls_factory, tmp_path: Path) -> None:
    cfg = tmp_path / "ops.yaml"
    cfg.write_text(CONFIG)
    proc = rls_factory(cfg, env={"RLS_ADMIN_TOKEN": "s3cret"})
    assert "admin token on" in proc.log()
    base = ("counters", "--admin", proc.http_url, "--domain", "ops", "-d", "k=1", "--add", "1")
    denied = rls(*base)
    assert denied.returncode == 1
    assert denied.stdout == ""
    assert denied.stderr.strip() == (
        "rls counters: HTTP 401: missing or wrong bearer token "
        "(pass --token or set RLS_ADMIN_TOKEN)"
    )
    allowed = rls(*base, "--token", "s3cret")
    assert allowed.returncode == 0, allowed.stderr
    assert '"overallCode": "OK"' in allowed.stdout
    switches = rls("switches", "--admin", proc.http_url, "--shadow-mode", "on")
    assert switches.returncode == 1 and switches.stderr.startswith("rls switches: HTTP 401: ")
    purge = rls("cache", "purge", "--api", "x", "--admin", proc.http_url, "--token", "s3cret")
    assert purge.returncode != 0 and purge.stderr.startswith("rls cache purge: HTTP ")
    unreachable = rls("counters", "--admin", "http://127.0.0.1:9", "--domain", "ops",
                      "-d", "k=1")
    assert unreachable.returncode == 2
    assert unreachable.stderr.startswith("rls counters: cannot reach http://127.0.0.1:9")


def test_debug_log_says_which_limit_a_descriptor_matched(caplog) -> None:
    config = load_files([("ops.yaml", CONFIG)])
    with caplog.at_level(logging.DEBUG, logger="rls.match"):
        match(config.domains["ops"], [("k", "1")])
        match(config.domains["ops"], [("nope", "x")])
    assert "descriptor ops [k=1]: matched k (any value) -> ops.k.1second: 10/second; " \
        "ops.k.1day: 10000/day" in caplog.text
    assert "descriptor ops [nope=x]: no limit: nothing for nope=x" in caplog.text


def test_debug_log_costs_nothing_when_off(caplog) -> None:
    config = load_files([("ops.yaml", CONFIG)])
    with caplog.at_level(logging.INFO, logger="rls.match"):
        match(config.domains["ops"], [("k", "1")])
    assert caplog.text == ""


def test_two_limits_on_one_node_get_distinct_metric_keys() -> None:
    config = load_files([("ops.yaml", CONFIG)])
    keys = [lim.full_key for lim in match(config.domains["ops"], [("k", "1")])[-1].limits]
    assert keys == ["ops.k.1second", "ops.k.1day"]
    named = [lim.full_key for lim in match(config.domains["ops"], [("named", "1")])[-1].limits]
    assert named == ["ops.named.burst", "ops.named.daily"]


def test_every_log_line_names_its_worker(rls_factory, redis_url: str, tmp_path: Path) -> None:
    cfg = tmp_path / "ops.yaml"
    cfg.write_text(CONFIG)
    proc = rls_factory(cfg, args=("--workers", "2", "--redis-url", redis_url))
    wait_until(lambda: proc.log().count("rls serving gRPC") == 2, timeout=30,
               what="both workers serving")
    lines = [line for line in proc.log().splitlines()
             if re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ", line)]
    assert lines
    assert all(re.search(r" \[worker (0|1|supervisor)\] ", line) for line in lines), lines
    assert any("[worker 0]" in line for line in lines)
    assert any("[worker 1]" in line for line in lines)
