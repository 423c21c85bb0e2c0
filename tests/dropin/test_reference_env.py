"""envoyproxy/ratelimit's Redis environment variables map onto rls URLs."""

from __future__ import annotations

import pytest

from rls.stores.redis.urls import normalize_redis_url


@pytest.mark.parametrize(
    ("url", "env", "expected"),
    [
        ("localhost:6379", {}, "redis://localhost:6379"),
        ("/var/run/redis.sock", {}, "unix:///var/run/redis.sock"),
        ("127.0.0.1:6379", {"REDIS_SOCKET_TYPE": "tcp", "REDIS_TLS": "true"},
         "rediss://127.0.0.1:6379"),
        ("127.0.0.1:6379", {"REDIS_AUTH": "s3cret"}, "redis://:s3cret@127.0.0.1:6379"),
        ("127.0.0.1:6379", {"REDIS_AUTH": "app:p@ss:x"}, "redis://app:p%40ss%3Ax@127.0.0.1:6379"),
        ("mymaster,h1:26379,h2:26379", {"REDIS_TYPE": "sentinel"},
         "redis+sentinel://h1:26379,h2:26379/mymaster"),
        ("h1:7000,h2:7001", {"REDIS_TYPE": "CLUSTER"}, "redis+cluster://h1:7000,h2:7001"),
        ("redis://already:1/2", {"REDIS_TYPE": "cluster"}, "redis://already:1/2"),
        ("", {}, ""),
    ],
)
def test_reference_redis_settings_become_urls(url: str, env: dict[str, str], expected: str):
    assert normalize_redis_url(url, env) == expected


def test_sentinel_without_hosts_and_unknown_type_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="master,host:port"):
        normalize_redis_url("mymaster", {"REDIS_TYPE": "sentinel"})
    with pytest.raises(ValueError, match="unrecognized REDIS_TYPE"):
        normalize_redis_url("h:1", {"REDIS_TYPE": "proxy"})


def test_serve_reads_reference_redis_url(monkeypatch: pytest.MonkeyPatch) -> None:
    from rls.cli.main import parser
    from rls.cli.serve import settings_from

    monkeypatch.setenv("REDIS_URL", "localhost:6379")
    monkeypatch.setenv("REDIS_SOCKET_TYPE", "tcp")
    settings = settings_from(parser().parse_args(["serve"]))
    assert settings.redis_url == "redis://localhost:6379"
