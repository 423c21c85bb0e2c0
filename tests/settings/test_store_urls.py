"""Issue 25 item 2: store URLs are checked at start (scheme, host, port, db), not ten seconds
later by a connection to the wrong place; a good URL of every supported form passes."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.rls_cli import rls

from rls.stores.redis.urls import bare_url_problem, url_problem

GOOD = [
    "redis://127.0.0.1:6379", "redis://127.0.0.1:6379/0", "redis://redis/3", "redis://:pw@h",
    "redis://u:p%40x@h:1/15", "redis://[::1]:6379/2", "rediss://h:6380/1?ssl_cert_reqs=none",
    "unix:///run/redis.sock", "unix:///run/redis.sock?db=2",
    "redis+sentinel://a:26379,b:26379/mymaster", "redis+sentinel://a:1,b:2/mymaster/3",
    "redis+cluster://a:7000,b:7001", "ssdb://h:8888", "memory://",
]
BAD = [
    ("redis://host:6379/abc", "db 'abc' is not a number"),
    ("redis://:6379/0", "no host"),
    ("redis://h:99999", "port '99999'"),
    ("redis://h:port", "port 'port'"),
    ("unix:///run/redis.sock?db=one", "db 'one'"),
    ("redis+sentinel://a:1,b:2", "service name"),
    ("redis+cluster://a:1,b:2/1", "only db 0"),
]


@pytest.mark.parametrize("url", GOOD)
def test_every_supported_url_form_passes(url: str) -> None:
    assert url_problem(url) is None
    assert bare_url_problem(url) is None


@pytest.mark.parametrize(("url", "why"), BAD)
def test_malformed_url_is_refused_with_the_reason(url: str, why: str) -> None:
    problem = url_problem(url)
    assert problem is not None and why in problem, problem


@pytest.mark.parametrize("value", ["127.0.0.1:6379", "redis:6379", "/run/redis.sock",
                                   "mymaster,s1:26379"])
def test_reference_style_values_are_not_taken_for_broken_urls(value: str) -> None:
    assert bare_url_problem(value) is None


def test_scheme_with_one_slash_suggests_the_url_meant() -> None:
    assert bare_url_problem("redis:/127.0.0.1:6379") == (
        "'redis:' must be followed by '//': did you mean 'redis://127.0.0.1:6379'?"
    )


@pytest.mark.process
def test_cache_rules_store_url_is_checked_too(tmp_path: Path) -> None:
    rules = tmp_path / "cache.yaml"
    rules.write_text("store: redis://:secret@cache:6379/abc\nrules: []\n")
    done = rls("check-config", str(rules))
    assert done.returncode == 1
    assert "'store'" in done.stderr and "db 'abc' is not a number" in done.stderr
    assert "secret" not in done.stderr
