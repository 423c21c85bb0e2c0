"""What `/bin/ratelimit` makes of the reference's variables (settings.reference_env.plan), and the
two start-up lines it adds: the variables rls ignores, and USE_STATSD=true's pointer to the
metrics."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from support.net import free_port

from rls.cli.ratelimit_entry import USAGE
from rls.cli.ratelimit_entry import main as ratelimit_main
from rls.settings import SettingError, Settings, reference_env
from rls.settings.reference_env import REFERENCE_VARIABLES, honoured, ignored, plan

from .helpers import STATSD_LINE, Ratelimit, ignored_lines


def flags(argv: list[str]) -> dict[str, str | None]:
    """`--name value` / bare `--name` of a plan's argv."""
    out: dict[str, str | None] = {}
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[arg] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def test_reference_defaults_become_rls_serve_flags(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    got = plan({"RUNTIME_ROOT": str(tmp_path), "USE_PROMETHEUS": "true"})
    assert got.problem is None
    assert got.argv[0] == "serve"
    assert flags(got.argv) == {
        "--grpc-addr": "0.0.0.0:8081", "--http-addr": "0.0.0.0:8080", "--admin-read-only": None,
        "--config": f"{tmp_path}/config", "--allow-empty-config": None,
        "--config-all-files": None, "--prometheus-addr": ":9090", "--reference-metrics": None,
        "--failure-mode": "error",
    }


def test_a_store_failure_is_an_error_for_envoy_to_decide_unless_rls_is_told_otherwise() -> None:
    """The reference returns a gRPC error when Redis fails, so Envoy's failure_mode_deny (Envoy
    Gateway's failClosed) decides: /bin/ratelimit answers UNAVAILABLE too, not an OK of its
    own; RLS_FAILURE_MODE still wins."""
    assert flags(plan({"RLS_CONFIG": "/x"}).argv)["--failure-mode"] == "error"
    assert "--failure-mode" not in plan({"RLS_CONFIG": "/x", "RLS_FAILURE_MODE": "allow"}).argv


def test_rls_variables_win_and_a_token_opens_the_whole_admin_api(tmp_path: Path) -> None:
    got = plan({"RLS_GRPC_ADDR": "127.0.0.1:1", "GRPC_PORT": "9", "RLS_ADMIN_TOKEN": "t",
                "RLS_CONFIG": "/x", "GRPC_UDS": "/run/rl.sock"})
    assert "--grpc-addr" not in got.argv and "--config" not in got.argv
    assert "--admin-read-only" not in got.argv
    uds = plan({"GRPC_UDS": "/run/rl.sock", "RUNTIME_ROOT": str(tmp_path),
                "RUNTIME_APPDIRECTORY": "."})
    assert flags(uds.argv)["--grpc-addr"] == "unix:/run/rl.sock"
    assert flags(plan({"HOST": "::", "RLS_CONFIG": "/x"}).argv)["--http-addr"] == "[::]:8080"


@pytest.mark.parametrize(("env", "problem"), [
    ({"PORT": "80a"}, "PORT: '80a' is not a port number"),
    ({"GRPC_PORT": "70000"}, "GRPC_PORT: '70000' is not a port number"),
    ({"CONFIG_TYPE": "file"}, "CONFIG_TYPE: 'file' is not one of FILE, GRPC_XDS_SOTW"),
    ({"RLS_CONFIG": "/x", "BACKEND_TYPE": "memcache"}, "BACKEND_TYPE: 'memcache': rls keeps"),
    ({"RLS_CONFIG": "/x", "USE_PROMETHEUS": "maybe"}, "USE_PROMETHEUS: 'maybe' is not true"),
    ({"RUNTIME_ROOT": "/nonexistent", "RUNTIME_SUBDIRECTORY": "rl"},
     "CONFIG_TYPE=FILE: the config directory /nonexistent/rl/config (RUNTIME_ROOT/"),
])
def test_a_value_rls_cannot_act_on_is_refused_naming_its_variable(
    env: dict[str, str], problem: str,
) -> None:
    got = plan(env)
    assert got.problem is not None and got.problem.startswith(problem), got.problem


def test_ignored_variables_are_those_rls_reads_nowhere(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"RLS_CONFIG": "/x", "DEBUG_PORT": "6070", "RUNTIME_ROOT": "/d", "REDIS_URL": "h:1",
           "REDIS_TYPE": "single", "PATH": "/bin", "EXTRA_TAGS": "a:b",
           "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
    assert {"DEBUG_PORT", "EXTRA_TAGS"} <= set(ignored(env))
    assert not {"RUNTIME_ROOT", "REDIS_URL", "REDIS_TYPE", "PATH"} & set(ignored(env))
    # Mapped later in REFERENCE_ENV (another feature): off the line by itself.
    monkeypatch.setitem(reference_env.REFERENCE_ENV, "debug_port_feature", "DEBUG_PORT")
    monkeypatch.setitem(reference_env.REFERENCE_ENV, "tracing", "TRACING_ENABLED")
    assert "DEBUG_PORT" not in ignored(env)
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in ignored(env)  # the OTel SDK reads it then
    line = [text for _, text in plan(env).notes if "ignored by rls" in text]
    assert line == [f"reference variables set but ignored by rls: {', '.join(ignored(env))} "
                    "(see docs/envoy-gateway.md)"]
    assert set(ignored(env)) <= REFERENCE_VARIABLES


def test_use_statsd_true_says_once_where_the_metrics_are() -> None:
    env = {"RLS_CONFIG": "/x", "USE_STATSD": "true", "PORT": "7", "USE_PROMETHEUS": "1",
           "PROMETHEUS_ADDR": ":19001", "PROMETHEUS_PATH": "/m"}
    lines = [text for level, text in plan(env).notes if level == logging.WARNING]
    assert [line for line in lines if line.startswith(STATSD_LINE)] == [
        "USE_STATSD=true: rls sends no statsd; its metrics are Prometheus text at "
        "http://0.0.0.0:7/metrics and http://0.0.0.0:19001/m (names: docs/envoy-gateway.md)"]
    assert not [t for _, t in plan({"RLS_CONFIG": "/x", "USE_STATSD": "false"}).notes
                if t.startswith(STATSD_LINE)]


def test_ratelimit_takes_no_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert ratelimit_main(["serve"]) == 2
    assert USAGE in capsys.readouterr().err
    assert ratelimit_main(["--help"]) == 0
    assert capsys.readouterr().out.startswith(USAGE + "\n")


def help_lines(capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """`ratelimit --help`'s variables: name -> its line, wrapped lines joined."""
    assert ratelimit_main(["--help"]) == 0
    out: dict[str, str] = {}
    last = ""
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("      ") and last:
            out[last] += " " + line.strip()
        elif line.startswith("  ") and line[2:3].isupper():
            last = line.split()[0]
            assert last not in out, f"{last} listed twice"
            out[last] = line.strip()
        else:
            last = ""
    return out


def test_ratelimit_help_lists_every_variable_it_reads_with_its_default(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = help_lines(capsys)
    assert set(lines) == set(honoured())
    assert lines["GRPC_PORT"] == "GRPC_PORT  --grpc-addr port (default 8081)"
    assert lines["PROMETHEUS_ADDR"].startswith("PROMETHEUS_ADDR  --prometheus-addr (default :9090)")
    assert lines["CACHE_KEY_PREFIX"].startswith("CACHE_KEY_PREFIX  --key-prefix (default rl:)")
    assert lines["LIMIT_RESET_HEADER"].startswith(
        "LIMIT_RESET_HEADER  --reset-header (default RateLimit-Reset)")
    assert "(default" in lines["CONFIG_TYPE"] and "(default" in lines["SHADOW_MODE"]
    # Derived from the tables: a variable mapped there later is listed by itself.
    monkeypatch.setitem(reference_env.REFERENCE_ENV, "near_limit_ratio", "DEBUG_PORT")
    assert lines != help_lines(capsys)
    assert help_lines(capsys)["DEBUG_PORT"].startswith("DEBUG_PORT  --near-limit-ratio")


def test_read_only_admin_may_listen_off_loopback_without_a_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RLS_ADMIN_TOKEN", raising=False)
    Settings(http_addr="0.0.0.0:8080", admin_read_only=True).validate()
    with pytest.raises(SettingError, match="--admin-read-only"):
        Settings(http_addr="0.0.0.0:8080").validate()
    with pytest.raises(SettingError, match="must start with /"):
        Settings(prometheus_addr=":9090", prometheus_path="metrics").validate()


@pytest.mark.process
def test_the_lines_are_logged_at_start(root: Path, launch: Callable[..., Ratelimit]) -> None:
    (root / "config").mkdir()
    env = {"RUNTIME_ROOT": str(root), "HOST": "127.0.0.1", "PORT": str(free_port()),
           "GRPC_PORT": str(free_port()), "USE_STATSD": "true", "STATSD_PORT": "9125",
           "DEBUG_PORT": "6070"}
    rl = launch(env)
    log = rl.log()
    assert log.count(STATSD_LINE) == 1
    assert ignored_lines(log) == [["DEBUG_PORT", "STATSD_PORT"]]
