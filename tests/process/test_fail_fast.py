"""Issue 18 item 3: `rls serve` fails fast and says why in one line.

- no --config, or a path that does not exist: exit 2 with one line (unless
  --allow-empty-config); a config that does not load at startup: exit 1;
- every bad setting: one line naming the flag or environment variable, exit 2;
- a reload down to zero domains is an error that keeps the old config;
- gRPC health is NOT_SERVING while no config is loaded;
- an unreachable cache store is reported at startup.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from conftest import free_port, http_get, wait_until
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.rls_cli import ROOT, rls

CONFIG = """domain: ff
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 7}
"""


def serve_args() -> list[str]:
    return ["serve", "--grpc-addr", f"127.0.0.1:{free_port()}",
            "--http-addr", f"127.0.0.1:{free_port()}"]


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.mark.process
def test_missing_config_path_exits_2_with_one_line_naming_it() -> None:
    done = rls(*serve_args(), "--config", "/nonexistent/rls.yaml", timeout=30)
    assert done.returncode == 2
    assert "/nonexistent/rls.yaml" in one_line(done.stderr)


@pytest.mark.process
def test_no_config_exits_2_and_names_the_flag_that_allows_it() -> None:
    done = rls(*serve_args(), timeout=30)
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert "--config" in line and "--allow-empty-config" in line


@pytest.mark.process
def test_config_that_fails_to_load_at_startup_exits_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("domain: ff\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight}\n")
    done = rls(*serve_args(), "--config", str(bad), timeout=30)
    assert done.returncode == 1
    assert f"{bad}: invalid rate limit unit 'fortnight'" in done.stderr
    assert f"at {bad}:4" in done.stderr


@pytest.mark.process
def test_empty_directory_at_startup_exits_1(tmp_path: Path) -> None:
    done = rls(*serve_args(), "--config", str(tmp_path), timeout=30)
    assert done.returncode == 1
    assert "no domain loaded" in done.stderr


@pytest.mark.process
def test_strict_serve_refuses_a_config_with_warnings(tmp_path: Path) -> None:
    cfg = tmp_path / "w.yaml"
    cfg.write_text("domain: ff\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute}\n")
    done = rls(*serve_args(), "--config", str(cfg), "--strict", timeout=30)
    assert done.returncode == 1
    assert "rate_limit without requests_per_unit" in done.stderr


BAD_SETTINGS = [
    (["--log-level", "verbose"], {}, "--log-level"),
    (["--log-format", "yaml"], {}, "--log-format"),
    (["--backend-timeout-ms", "-5"], {}, "--backend-timeout-ms"),
    (["--workers", "two"], {}, "--workers"),
    (["--near-limit-ratio", "1.5"], {}, "--near-limit-ratio"),
    ([], {"RLS_SHADOW_MODE": "maybe"}, "RLS_SHADOW_MODE"),
    ([], {"LOG_LEVEL": "loud"}, "LOG_LEVEL"),
    ([], {"RLS_FAILURE_MODE": "sometimes"}, "RLS_FAILURE_MODE"),
    (["--http-addr", "localhost"], {}, "--http-addr"),
    ([], {"REDIS_URL": "http://redis:6379"}, "REDIS_URL"),
    (["--redis-url", "redis:/127.0.0.1:6379"], {}, "--redis-url"),
    (["--redis-url", "redis://127.0.0.1:6379/abc"], {}, "--redis-url"),
    ([], {"RLS_REDIS_URL": "redis://:6379/0"}, "RLS_REDIS_URL"),
    ([], {"REDIS_URL": "127.0.0.1:port"}, "REDIS_URL"),
    ([], {"REDIS_SOCKET_TYPE": "unix", "REDIS_URL": "host:6379"}, "REDIS_URL"),
    (["--cache-config", "config/cache.yaml", "--cache-store", "redis://h:6379/x"], {},
     "--cache-store"),
    (["--cache-config", "config/cache.yaml", "--cache-store", "memcache://x"], {},
     "--cache-store"),
    (["--cache-config", "/nonexistent/cache.yaml"], {}, "--cache-config"),
    (["--extproc-addr", "localhost"], {}, "--extproc-addr"),
    (["--max-concurrent-streams", "0"], {}, "--max-concurrent-streams"),
]


@pytest.mark.process
@pytest.mark.parametrize(("args", "env", "named"), BAD_SETTINGS,
                         ids=[n for _, _, n in BAD_SETTINGS])
def test_bad_setting_is_one_line_naming_flag_or_variable_rc_2(
    args: list[str], env: dict[str, str], named: str
) -> None:
    done = rls(*serve_args(), "--config", str(ROOT / "config"), *args, env=env, timeout=30)
    assert done.returncode == 2, done.stderr
    assert one_line(done.stderr).startswith(f"rls: {named}: ")


def grpc_health(addr: str, service: str = "ratelimit") -> int:
    with grpc.insecure_channel(addr) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def test_grpc_health_not_serving_without_config_then_serving_once_loaded(
    rls_factory, tmp_path: Path
) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    proc = rls_factory(cfg, args=("--allow-empty-config", "--reload-interval", "0.2"),
                       wait_healthy=False)
    wait_until(lambda: http_get(proc.http_url + "/healthcheck")[0] in (200, 500, 503),
               timeout=30, what="admin up")
    for service in ("", "ratelimit"):
        assert grpc_health(proc.grpc_addr, service) == health_pb2.HealthCheckResponse.NOT_SERVING
    # /json answers a JSON error with 503 while no config is loaded (docs/admin.md)
    req = urllib.request.Request(proc.http_url + "/json", data=b'{"domain": "ff"}',
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=5)
    assert info.value.code == 503
    assert json.loads(info.value.read()) == {"error": "no config loaded"}
    (cfg / "ff.yaml").write_text(CONFIG)
    wait_until(lambda: grpc_health(proc.grpc_addr) == health_pb2.HealthCheckResponse.SERVING,
               timeout=10, what="SERVING after the config appeared")


def test_reload_to_zero_domains_is_an_error_that_keeps_the_old_config(
    rls_factory, tmp_path: Path
) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    path = cfg / "ff.yaml"
    path.write_text(CONFIG)
    proc = rls_factory(cfg, args=("--reload-interval", "0.2"))
    assert grpc_health(proc.grpc_addr) == health_pb2.HealthCheckResponse.SERVING
    path.unlink()
    wait_until(lambda: "keeping previous config" in proc.log(), timeout=10,
               what="the zero-domain reload refused")
    log = proc.log()
    assert f"config change detected: {path}" in log
    assert "no domain loaded" in log
    status, body = http_get(proc.http_url + "/rlconfig")
    assert status == 200 and b"ff.user" in body and b"requests_per_unit=7" in body
    assert grpc_health(proc.grpc_addr) == health_pb2.HealthCheckResponse.SERVING


def test_unreachable_cache_store_is_reported_at_startup(rls_factory, tmp_path: Path) -> None:
    cfg = tmp_path / "ff.yaml"
    cfg.write_text(CONFIG)
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    proc = rls_factory(cfg, args=("--cache-config", str(ROOT / "config" / "cache.yaml"),
                                  "--cache-store", dead))
    deadline = time.monotonic() + 10
    while "unreachable at startup" not in proc.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert f"cache store {dead} unreachable at startup" in proc.log()


@pytest.mark.process
def test_workers_with_a_bad_config_exit_1_instead_of_restarting_forever(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("domain: ff\ndescriptors:\n  - value: x\n")
    done = rls(*serve_args(), "--config", str(bad), "--workers", "2",
               "--redis-url", f"redis://127.0.0.1:{free_port()}/0", timeout=30)
    assert done.returncode == 1
    line = one_line(done.stderr)
    assert line.startswith(f"rls: cannot start: the config does not load: {bad}: "
                           f"descriptor has empty key (at {bad}:3"), line
    assert line.endswith(f"(every problem: rls check-config {bad})"), line


@pytest.mark.parametrize("level", ["WARN", "trace", "fatal"])
def test_reference_log_level_names_are_accepted(rls_factory, tmp_path: Path, level: str) -> None:
    cfg = tmp_path / "ff.yaml"
    cfg.write_text(CONFIG)
    proc = rls_factory(cfg, env={"LOG_LEVEL": level})  # waits until /healthcheck is 200
    assert "Traceback" not in proc.log()


def test_empty_directory_next_to_a_good_one_is_a_logged_warning(
    rls_factory, tmp_path: Path
) -> None:
    good, empty = tmp_path / "good", tmp_path / "empty"
    good.mkdir()
    empty.mkdir()
    (good / "ff.yaml").write_text(CONFIG)
    proc = rls_factory(good, empty)
    assert f"{empty}: warning: directory has no descriptor files" in proc.log()
    strict = rls(*serve_args(), "--config", str(good), "--config", str(empty), "--strict",
                 timeout=30)
    assert strict.returncode == 2
    assert "directory has no descriptor files" in one_line(strict.stderr)


def test_serve_logs_a_misindented_limit_and_strict_refuses_it(rls_factory, tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    bad = cfg / "ff.yaml"
    bad.write_text("domain: ff\ndescriptors:\n  - key: user\n    rate_limit:\n"
                   "    unit: minute\n    requests_per_unit: 7\n")
    proc = rls_factory(cfg)
    assert f"{bad}: warning: 'unit' is a rate limit field" in proc.log()
    assert "empty rate_limit" in proc.log()
    strict = rls(*serve_args(), "--config", str(bad), "--strict", timeout=30)
    assert strict.returncode == 1
    assert f"at {bad}:" in strict.stderr


@pytest.mark.process
def test_config_path_that_is_a_looping_or_dangling_link_says_so(tmp_path: Path) -> None:
    """Such a path is there (`ls` lists it), so "no such file or directory" misled."""
    loop = tmp_path / "loop.yaml"
    loop.symlink_to("loop.yaml")
    dangling = tmp_path / "dangling.yaml"
    dangling.symlink_to(tmp_path / "gone.yaml")
    for path, says in ((loop, "too many levels of symbolic links"),
                       (dangling, "no such file or directory")):
        done = rls(*serve_args(), "--config", str(path), timeout=30)
        assert done.returncode == 2
        assert one_line(done.stderr) == (
            f"rls: --config: {path}: a symbolic link to {path.readlink()}: {says}")
        check = rls("check-config", str(path), timeout=30)
        assert check.returncode == 1
        assert f"{path}: a symbolic link to {path.readlink()}: {says}" in check.stderr
