"""scripts/xds_server.py, the documented example management server: rls follows the YAML
files it serves, and a changed file reaches rls as a new version; over mTLS, the walk of
docs/envoy-gateway.md run as printed (its openssl commands, the server's flags, rls's
variables) gets rls its config, and a client without a certificate gets nothing."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import ROOT
from support.net import connectable, free_port
from support.processes import stop_process
from support.waiting import wait_until

from rls.config.xds.convert import TYPE_URL

from .calls import OK, OVER_LIMIT, decide
from .test_xds_config import rlconfig

LIMITS = """
domain: example
descriptors:
  - key: user
    rate_limit: {unit: MINUTE, requests_per_unit: %d}
"""


def test_rls_follows_the_example_server_and_its_file_changes(
    tmp_path: Path, rls_factory: Callable[..., Any]
) -> None:
    limits = tmp_path / "limits.yaml"
    limits.write_text(LIMITS % 1)
    port = free_port()
    log_path = tmp_path / "xds_server.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [sys.executable, str(ROOT / "scripts" / "xds_server.py"), "--port", str(port),
             str(limits)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: connectable(port), 15, "the example server", log_path.read_text)
        rls = rls_factory(env={"CONFIG_TYPE": "GRPC_XDS_SOTW",
                               "CONFIG_GRPC_XDS_SERVER_URL": f"127.0.0.1:{port}"})
        assert decide(rls.grpc_addr, "example", ("user", "a")) == OK
        assert decide(rls.grpc_addr, "example", ("user", "a")) == OVER_LIMIT
        limits.write_text(LIMITS % 3)
        wait_until(lambda: "ACKed version 2" in log_path.read_text(), 15, "version 2 ACKed",
                   log_path.read_text)
        assert decide(rls.grpc_addr, "example", ("user", "a")) == OK  # 2 of 3
    finally:
        stop_process(server)


GUIDE = ROOT / "docs" / "envoy-gateway.md"
SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.M | re.S)


def guide_block(containing: str) -> str:
    found = [b for b in SH_BLOCK.findall(GUIDE.read_text()) if containing in b]
    assert len(found) == 1, f"one sh block of {GUIDE.name} with {containing!r}: {found}"
    return found[0]


def guide_commands(containing: str) -> list[list[str]]:
    """The commands of that block, continued lines joined, each split as a shell would."""
    return [shlex.split(c) for c in guide_block(containing).replace("\\\n", " ").splitlines()
            if c.strip() and not c.lstrip().startswith("#")]


@pytest.fixture
def example_server(tmp_path: Path) -> Iterator[Callable[[list[str]], Path]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str]) -> Path:
        """scripts/xds_server.py with `argv` (its arguments), from the repository root; the
        path of its log."""
        log_path = tmp_path / f"xds_server-{len(started)}.log"
        with open(log_path, "wb") as log:
            started.append(subprocess.Popen(
                [sys.executable, str(ROOT / "scripts" / "xds_server.py"), *argv], stdout=log,
                stderr=subprocess.STDOUT, cwd=str(ROOT)))
        return log_path

    yield start
    for server in started:
        stop_process(server)


def test_the_documented_mtls_walk_gets_rls_its_config_and_refuses_a_client_without_one(
    tmp_path: Path, rls_factory: Callable[..., Any],
    example_server: Callable[[list[str]], Path],
) -> None:
    done = subprocess.run(["sh", "-e", "-c", guide_block("openssl req -x509")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    certs = tmp_path / "xds-certs"
    server_cmd, rls_cmd = guide_commands("--client-ca")
    port = free_port()

    def here(word: str) -> str:  # the guide's relative paths and port, moved to this test's
        return word.replace("xds-certs/", f"{certs}/").replace(":18001", f":{port}")

    assert server_cmd[:2] == ["python", "scripts/xds_server.py"]
    args = [here(w) for w in server_cmd[2:]]
    args[args.index("--port") + 1] = str(port)
    log_path = example_server(args)
    wait_until(lambda: connectable(port), 15, "the example server", log_path.read_text)
    assert "mTLS, client certificates from" in log_path.read_text()

    assert rls_cmd[-2:] == ["rls", "serve"]
    env = dict(here(w).split("=", 1) for w in rls_cmd[:-2])
    assert env["CONFIG_GRPC_XDS_SERVER_USE_TLS"] == "true"
    rls = rls_factory(env=env)
    wait_until(lambda: "node default ACKed version 1" in log_path.read_text(), 15,
               "version 1 ACKed over mTLS", log_path.read_text)
    source = rlconfig(rls)["source"]
    assert source["connected"] is True and source["version"] == "1"

    for name in ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY"):
        del env[name]
    env["FORCE_START_WITHOUT_INITIAL_CONFIG"] = "true"
    without = rls_factory(env=env)
    wait_until(lambda: (rlconfig(without)["source"]["last_stream_error"] or {}).get("error"),
               15, "a refused connection", without.log)
    assert "requires a client certificate" in rlconfig(without)["source"]["last_stream_error"][
        "error"]
    assert "ACKed" not in log_path.read_text().split("node default ACKed version 1", 1)[1]


def test_the_example_server_refuses_a_file_with_rls_extensions_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "xds_server.py"), "--port", str(free_port()),
         "config/example.yaml"], cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("xds_server.py: config/example.yaml: "), done.stderr
    assert '"charge"' in done.stderr, done.stderr


def test_a_client_that_goes_away_is_one_log_line_for_the_example_server(
    example_server: Callable[[list[str]], Path],
) -> None:
    from envoy.config.core.v3 import base_pb2
    from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

    port = free_port()
    log_path = example_server(["--port", str(port), "scripts/xds_example.yaml"])
    wait_until(lambda: connectable(port), 15, "the example server", log_path.read_text)
    hold = threading.Event()

    def requests() -> Iterator[discovery_pb2.DiscoveryRequest]:
        yield discovery_pb2.DiscoveryRequest(
            node=base_pb2.Node(id="leaving"),
            type_url=TYPE_URL)
        hold.wait(30)  # the stream stays open until the client cancels it

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel).StreamAggregatedResources(
            requests())
        assert next(call).version_info == "1"
        call.cancel()
    hold.set()
    wait_until(lambda: "node leaving disconnected" in log_path.read_text(), 15,
               "the disconnect logged", log_path.read_text)
    assert "Traceback" not in log_path.read_text()
