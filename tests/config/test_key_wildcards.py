"""A `*` in a descriptor key: literal in rls, a wildcard over `key_value` in
envoyproxy/ratelimit (config_impl.go: every node whose joined `key_value` holds a `*` is tried,
in config order, for an entry no node took exactly). rls says so only where the two decide a
request entry differently, once per node per process — never for the route keys Envoy Gateway
generates (`…/match/0/*` as key and value, every request taken exactly) — and
`rls check-config` notes each such node offline."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from rls.config import key_wildcards
from rls.config.loader import load_files
from rls.config.matcher import match
from rls.config.model import RateLimitConfig

EG_ROUTE = "httproute/default/backend/rule/0/match/0/*"
EG_OTHER_ROUTE = "httproute/default/backend/rule/0/match/0/www_example_com"


def config(text: str) -> RateLimitConfig:
    return load_files([("f.yaml", text)])


EG = f"""
domain: default/eg/http
descriptors:
  - key: {EG_ROUTE}
    value: {EG_ROUTE}
    descriptors:
      - key: rule-0-match-0
        rate_limit: {{unit: hour, requests_per_unit: 3}}
  - key: {EG_OTHER_ROUTE}
    value: {EG_OTHER_ROUTE}
    descriptors:
      - key: rule-0-match-0
        rate_limit: {{unit: hour, requests_per_unit: 5}}
"""

FILE = """
domain: d
descriptors:
  - key: foo*
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: food
    value: "*"
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: a*
    value: b
    rate_limit: {unit: minute, requests_per_unit: 3}
"""


@pytest.fixture(autouse=True)
def fresh_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no node told about (the record is per process)."""
    monkeypatch.setattr(key_wildcards, "_TOLD", key_wildcards.BoundedCache("t", 1000, 1 << 20))


def told(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "rls.match" and r.levelno == logging.WARNING]


def test_envoy_gateway_route_keys_are_decided_alike_and_nothing_is_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    cfg = config(EG)
    assert cfg.warnings == ()  # a push of this config says nothing
    domain = cfg.domains["default/eg/http"]
    for route in (EG_ROUTE, EG_OTHER_ROUTE):
        path = match(domain, [(route, route), ("rule-0-match-0", "alice")])
        assert path is not None and path[0].key == route
    assert told(caplog) == []


def test_an_entry_the_reference_takes_by_the_key_wildcard_is_said_once_per_node(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    domain = config(FILE).domains["d"]
    # `foobar`: the reference takes `foo*` (its pattern fits `foobar_x`); rls has no node
    assert match(domain, [("foobar", "x")]) is None
    assert match(domain, [("foobaz", "y")]) is None  # the same node: not said again
    # `food`: rls takes `food=*`; the reference takes `foo*`, first in config order
    assert match(domain, [("food", "z")]) is not None
    # the key's `*` reaching into the value: `a*_x_b` fits `a*_b`; rls takes nothing
    assert match(domain, [("a*", "x_b")]) is None
    said = told(caplog)
    assert len(said) == 2, said  # `foo*` once, `a*_b` once
    assert said[0].startswith("descriptor d [foobar=x]: envoyproxy/ratelimit decides entry "
                              "foobar=x by node 'foo*'"), said[0]
    assert "here it has no node for it" in said[0]
    assert "'a*_b'" in said[1]
    # a new config (a reload, a push) with the same node: still said once
    match(config(FILE).domains["d"], [("foobar", "again")])
    assert len(told(caplog)) == 2


def test_entries_the_two_decide_alike_are_not_said(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    domain = config(FILE).domains["d"]
    assert match(domain, [("foo*", "v")]) is not None  # the key itself: alike
    assert match(domain, [("a*", "b")]) is not None  # exact: alike
    assert match(domain, [("bar", "v")]) is None  # fits no pattern: alike
    assert told(caplog) == []


@pytest.mark.process  # runs `rls check-config`
def test_check_config_notes_each_star_key_offline(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_text(FILE)
    done = subprocess.run([sys.executable, "-m", "rls", "check-config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if "is literal in rls" in line]
    assert len(notes) == 2, done.stderr
    assert notes[0].startswith(f"{path}: warning: '*' in key 'foo*' is literal in rls: "
                               "envoyproxy/ratelimit also matches entries whose key_value "
                               "fits 'foo*'"), notes[0]
    assert "node d.foo*" in notes[0] and "node d.a*_b" in notes[1]
    strict = subprocess.run([sys.executable, "-m", "rls", "check-config", "--strict",
                             str(path)], capture_output=True, text=True, timeout=60)
    assert strict.returncode == 1
