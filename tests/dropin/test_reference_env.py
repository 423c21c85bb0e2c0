"""envoyproxy/ratelimit's environment under `rls serve`: the Redis variables map onto rls
URLs, and the reference variables it does not read (those only `/bin/ratelimit` translates,
USE_PROMETHEUS and PROMETHEUS_ADDR among them) are named at start instead of ignored silently."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from conftest import RlsProcess
from support.waiting import wait_until

from rls.cli.reference_help import read_by_serve, serve_ignored, serve_note
from rls.settings.reference_env import REFERENCE_VARIABLES, honoured
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


def test_serve_names_the_prometheus_variables_only_the_ratelimit_entry_reads() -> None:
    env = {"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":19001", "REDIS_URL": "h:1",
           "GRPC_SERVER_USE_TLS": "false", "CONFIG_TYPE": "FILE", "PROMETHEUS_PATH": "/m",
           "PROMETHEUS_MAPPER_YAML": "/x", "PATH": "/bin"}
    assert serve_ignored(env) == ["PROMETHEUS_ADDR", "PROMETHEUS_MAPPER_YAML", "USE_PROMETHEUS"]
    note = serve_note(env)
    assert note is not None
    assert note[1] == (
        "reference variables set but ignored by rls serve: PROMETHEUS_ADDR, "
        "PROMETHEUS_MAPPER_YAML, USE_PROMETHEUS; PROMETHEUS_ADDR, USE_PROMETHEUS only under "
        "the `ratelimit` entry (/bin/ratelimit), rls serve takes flags instead "
        "(rls serve --help) (see docs/envoy-gateway.md)")
    assert serve_note({"REDIS_URL": "h:1", "PATH": "/bin"}) is None


def test_every_variable_the_entry_reads_is_read_or_named_by_serve() -> None:
    """The two readers agree: with every reference variable set, each one `/bin/ratelimit`
    honours is either read by `rls serve` or named in its line."""
    everything = dict.fromkeys(REFERENCE_VARIABLES, "x")
    named = set(serve_ignored(everything))
    assert honoured() <= read_by_serve() | named
    assert not read_by_serve() & named
    assert {"USE_PROMETHEUS", "PROMETHEUS_ADDR", "GRPC_PORT", "RUNTIME_ROOT"} <= named


def test_rls_serve_logs_the_line_at_start(rls_factory: Callable[..., RlsProcess]) -> None:
    rls = rls_factory("config/example.yaml",
                      env={"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":19001"})
    wait_until(lambda: "ignored by rls serve" in rls.log(), timeout=10, what="the line")
    lines = re.findall(r"ignored by rls serve: ([A-Z_, ]+);", rls.log())
    assert len(lines) == 1, rls.log()
    assert {"PROMETHEUS_ADDR", "USE_PROMETHEUS"} <= set(lines[0].split(", "))
