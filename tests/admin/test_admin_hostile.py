"""The admin API closed by default (issue 14 item 2, DESIGN §8): no token and a listener off
loopback refuses to start; with a token, /json and every mutation need it; POSTs take only
application/json; malformed, deep or huge bodies get a JSON 400/413; idle and slow clients are
disconnected; /healthcheck and /metrics stay open."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from config.test_config_dir import good
from conftest import ROOT, free_port
from support.net import http_call

from rls.admin.auth import IDLE_SECONDS

TOKEN = "s3cret-admin"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {"Content-Type": "application/json"}
REQUEST = {"domain": "alpha", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}


call = http_call


def used(url: str) -> int:
    body = json.dumps(REQUEST).encode()
    status, payload = call(url, "POST", "/counters", body, JSON)
    assert status == 200, payload
    return payload["results"][0]["limits"][0]["used"]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "a.yaml"
    path.write_text(good("alpha"))
    return path


@pytest.fixture
def guarded(rls_factory, config: Path):
    return rls_factory(config, env={"RLS_ADMIN_TOKEN": TOKEN})


def serve(config: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    full = {k: v for k, v in os.environ.items() if not k.startswith("RLS_")} | (env or {})
    cmd = [sys.executable, "-m", "rls", "serve", "--config", str(config),
           "--grpc-addr", f"127.0.0.1:{free_port()}", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full, cwd=str(ROOT))


@pytest.mark.process
@pytest.mark.parametrize("addr", ["0.0.0.0", "[::]", ""])
def test_admin_off_loopback_without_token_refuses_to_start(config: Path, addr: str) -> None:
    proc = serve(config, "--http-addr", f"{addr}:{free_port()}")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    assert "is not on loopback and RLS_ADMIN_TOKEN is not set" in lines[0]


@pytest.mark.process
@pytest.mark.parametrize("opt_out", ["flag", "env", "token"])
def test_admin_off_loopback_starts_with_token_or_explicit_opt_out(config: Path,
                                                                  opt_out: str) -> None:
    port = free_port()
    args = ["--http-addr", f"0.0.0.0:{port}"]
    env = {}
    if opt_out == "flag":
        args.append("--admin-insecure")
    elif opt_out == "env":
        env["RLS_ADMIN_INSECURE"] = "true"
    else:
        env["RLS_ADMIN_TOKEN"] = TOKEN
    proc = serve(config, *args, env=env)
    try:
        deadline = time.monotonic() + 30
        status = 0
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status = call(f"http://127.0.0.1:{port}", "GET", "/healthcheck")[0]
            except OSError:
                status = 0
            if status == 200:
                break
            time.sleep(0.1)
        assert status == 200, proc.poll()
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_json_needs_the_token_and_charges_nothing_without_it(guarded) -> None:
    url = guarded.http_url
    body = json.dumps(REQUEST).encode()
    status, payload = call(url, "POST", "/json", body, JSON)
    assert status == 401 and payload == {"error": "missing or wrong bearer token"}
    assert used(url) == 0
    status, payload = call(url, "POST", "/json", body, JSON | AUTH)
    assert status == 200 and payload["overallCode"] == "OK"
    assert used(url) == 1


@pytest.mark.parametrize("ctype", [None, "text/plain", "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x"])
def test_mutations_without_json_content_type_are_415(guarded, ctype: str | None) -> None:
    url = guarded.http_url
    headers = AUTH | ({"Content-Type": ctype} if ctype else {})
    for path, body in [("/switches", {"limiting_off": True}),
                       ("/add", {"items": [REQUEST]}), ("/json", REQUEST)]:
        raw = json.dumps(body).encode()
        req = urllib.request.Request(url + path, data=raw, method="POST", headers=headers)
        if ctype is None:  # urllib adds a form content type to any body; drop it
            req.remove_header("Content-type")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                status, payload = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, payload = exc.code, exc.read()
        assert status == 415, (path, ctype, payload)
        assert "application/json" in json.loads(payload)["error"]
    assert call(url, "GET", "/switches")[1]["limiting_off"] is False
    assert used(url) == 0


def test_cross_site_text_plain_post_is_refused_without_a_token_too(rls_factory,
                                                                    config: Path) -> None:
    rls = rls_factory(config)  # loopback, no token: the browser-on-the-same-host case
    raw = json.dumps({"limiting_off": True}).encode()
    status, _ = call(rls.http_url, "POST", "/switches", raw, {"Content-Type": "text/plain"})
    assert status == 415
    assert call(rls.http_url, "GET", "/switches")[1]["limiting_off"] is False


BAD = {
    "malformed": (b"{not json", 400),
    "empty": (b"", 400),
    "deep-list": (b"[" * 100_000 + b"]" * 100_000, 400),
    "deep-object": (b'{"a":' * 50 + b"1" + b"}" * 50, 400),
    "not-utf8": (b'{"domain": "\xff"}', 400),
    "too-large": (b'{"x": "' + b"a" * (2 << 20) + b'"}', 413),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_bodies_get_a_json_error_not_a_500(guarded, case: str) -> None:
    body, expected = BAD[case]
    url = guarded.http_url
    for path in ("/json", "/add", "/switches", "/counters"):
        try:
            status, payload = call(url, "POST", path, body, JSON | AUTH)
        except (ConnectionError, urllib.error.URLError):
            # aiohttp may answer 413 and close before the client finished sending
            assert expected == 413, (path, case)
            continue
        assert status == expected, (path, case, payload)
        assert isinstance(payload, dict) and payload.get("error"), (path, case, payload)
    assert used(url) == 0
    assert call(url, "GET", "/healthcheck")[0] == 200


def test_probes_stay_open_with_a_token(guarded) -> None:
    assert call(guarded.http_url, "GET", "/healthcheck") == (200, "OK")
    assert call(guarded.http_url, "GET", "/metrics")[0] == 200


def test_idle_and_slow_header_connections_are_closed(guarded) -> None:
    host, port = "127.0.0.1", guarded.http_port
    idle = socket.create_connection((host, port))
    slow = socket.create_connection((host, port))
    slow.sendall(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n")  # headers never finished
    limit = IDLE_SECONDS + 15
    for sock in (idle, slow):
        sock.settimeout(limit)
        start = time.monotonic()
        try:
            data = sock.recv(1024)
        except TimeoutError:
            data = None
        finally:
            sock.close()
        assert data == b"", f"connection still open after {time.monotonic() - start:.0f} s"
