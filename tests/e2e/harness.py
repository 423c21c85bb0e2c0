"""Process plumbing for the end-to-end tests: a real Envoy, a tiny backend, an HTTP client.

Kept free of pytest fixtures (those live in conftest.py) so the pieces can be reused and read
on their own. Nothing here sleeps to hope for readiness: every wait polls a condition and fails
loudly (with the process log) on timeout.
"""

from __future__ import annotations

import copy
import http.client
import json
import random
import subprocess
import threading
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml
from prometheus_client.parser import text_string_to_metric_families
from support.envoy import find_envoy as find_envoy  # re-exported
from support.net import free_port as free_port  # re-exported
from support.processes import stop_process
from support.waiting import wait_until as wait_for  # the e2e suites' name

from rls.demo import socket_addresses

ROOT = Path(__file__).resolve().parents[2]
ENVOY_DIR = ROOT / "envoy"
GATEWAY_YAML = ENVOY_DIR / "gateway.yaml"

HOUR = 3600  # seconds: the window of the end-to-end tests' limits

# Ports baked into envoy/gateway.yaml (the deployment defaults), by role.
RLS_PORT = 8081
BACKEND_PORT = 9001
ADMIN_PORT = 9901
LISTENER_PORT = 10000

# Path the gateway fixture uses to check the whole chain is up (own counters, no test uses it).
WARMUP_PATH = "/__e2e_warmup"


# --------------------------------------------------------------------------- HTTP client


@dataclass
class Response:
    status: int
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes

    def int_header(self, name: str) -> int:
        value = self.headers.get(name)
        assert value is not None, f"missing header {name!r} in {self.status} {self.headers}"
        return int(value)


def http_request(
    port: int,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    timeout: float = 5.0,
) -> Response:
    """One request on a fresh connection (no client-side retries, no exceptions on 4xx/5xx)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        merged: dict[str, str] = {}
        for name, value in resp.getheaders():
            key = name.lower()
            merged[key] = f"{merged[key]}, {value}" if key in merged else value
        return Response(resp.status, merged, data)
    finally:
        conn.close()


def http_get_text(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


# --------------------------------------------------------------------------- backend


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class Gate:
    """Holds the backend's answer to requests under a path prefix until the test releases them.

    Each held request waits on its own full path (query included), so a test names exactly
    which in-flight request to finish. A request still held after HOLD_TIMEOUT is answered
    anyway, so a failing test never leaves a server thread stuck.
    """

    HOLD_TIMEOUT = 20.0

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._events: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._open = False

    def _event(self, path: str) -> threading.Event:
        with self._lock:
            event = self._events.get(path)
            if event is None:
                event = self._events[path] = threading.Event()
                if self._open:
                    event.set()
            return event

    def wait(self, path: str) -> None:
        self._event(path).wait(self.HOLD_TIMEOUT)

    def release(self, path: str) -> None:
        """Let the (current or future) request for exactly `path` be answered."""
        self._event(path).set()

    def open(self) -> None:
        """Release every held request and stop holding new ones."""
        with self._lock:
            self._open = True
            events = list(self._events.values())
        for event in events:
            event.set()


class _BurstServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer whose listen backlog takes a burst of connections.

    The stdlib's backlog is 5: when Envoy opens 20 upstream connections at once and the accept
    thread is slow (a busy host), the kernel drops the extra SYNs, the retry comes after 1 s,
    past the cluster's connect_timeout, and Envoy answers 503 without reaching the backend.
    """

    request_queue_size = 128


class Backend:
    """A plain HTTP/1.1 upstream on a free port that records what reached it.

    The answer is a small JSON document, or exactly N bytes when the query has `size=N`; with
    `tokens=N` it carries `x-tokens-used: N` (a cost known only at the response, as an LLM
    backend reports the tokens it used).
    Requests under a prefix given to `hold()` are recorded at once but answered only when the
    test releases them (in-flight requests for concurrency tests).
    """

    def __init__(self) -> None:
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        self._gates: list[Gate] = []
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes: without this, Nagle + delayed ACK add
            # ~40 ms to every proxied request.
            disable_nagle_algorithm = True

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                seen = Seen(
                    self.command,
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                )
                with backend._lock:
                    backend.requests.append(seen)
                    gates = [g for g in backend._gates if self.path.startswith(g.prefix)]
                for gate in gates:
                    gate.wait(self.path)
                query = parse_qs(urlsplit(self.path).query)
                size = query.get("size")
                tokens = query.get("tokens")
                if size:
                    payload = b"x" * int(size[0])
                else:
                    payload = json.dumps(
                        {"path": self.path, "client": seen.headers.get("x-client-id"),
                         "bytes": len(body)}
                    ).encode()
                try:
                    self.send_response(200)
                    self.send_header(
                        "content-type", "application/octet-stream" if size else "application/json"
                    )
                    self.send_header("content-length", str(len(payload)))
                    if tokens:
                        self.send_header("x-tokens-used", tokens[0])
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    # The client (Envoy) went away while the request was held: nothing to do.
                    self.close_connection = True

            do_GET = do_POST = do_PUT = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = _BurstServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def start(self) -> Backend:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            gates = list(self._gates)
        for gate in gates:
            gate.open()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)

    def seen(self) -> list[Seen]:
        with self._lock:
            return list(self.requests)

    def hold(self, prefix: str) -> Gate:
        gate = Gate(prefix)
        with self._lock:
            self._gates.append(gate)
        return gate


# --------------------------------------------------------------------------- Envoy


def load_gateway(path: Path | str = GATEWAY_YAML) -> dict[str, Any]:
    """Parse an Envoy config; a bare file name is looked up in envoy/."""
    path = Path(path)
    if not path.is_absolute() and not path.exists():
        path = ENVOY_DIR / path
    with open(path) as f:
        return yaml.safe_load(f)




def rewrite_ports(config: dict[str, Any], ports: dict[int, int]) -> dict[str, Any]:
    """A copy of `config` with every socket_address port mapped through `ports`.

    Every port named in `ports` must occur in the config (so a renamed port fails loudly instead
    of silently pointing the test at a deployment default). Ports not named (e.g. a cluster
    added later) are moved to fresh free ports so the test never touches a real service.
    """
    out = copy.deepcopy(config)
    found: set[int] = set()
    for sa in socket_addresses(out):
        port = int(sa["port_value"])
        if port in ports:
            found.add(port)
            sa["port_value"] = ports[port]
        else:
            sa["port_value"] = free_port()
    missing = set(ports) - found
    assert not missing, f"ports {sorted(missing)} not found in the Envoy config"
    return out


@dataclass
class Envoy:
    proc: subprocess.Popen[bytes]
    listener_port: int
    admin_port: int
    log_path: Path
    base_id: int
    config_path: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ready(self) -> bool:
        return http_get_text(self.admin_url + "/ready")[0] == 200

    def counters(self, prefix: str = "") -> dict[str, int]:
        """Admin counters (and gauges) as name -> value, optionally filtered by prefix."""
        status, text = http_get_text(self.admin_url + "/stats")
        assert status == 200, text
        out: dict[str, int] = {}
        for line in text.splitlines():
            name, sep, value = line.partition(": ")
            if sep and name.startswith(prefix) and value.strip().lstrip("-").isdigit():
                out[name] = int(value)
        return out

    def request(self, method: str, path: str, **kwargs: Any) -> Response:
        return http_request(self.listener_port, method, path, **kwargs)

    def stop(self) -> int:
        stop_process(self.proc, 10)
        return self.proc.returncode


def start_envoy(
    binary: str, config: dict[str, Any], workdir: Path, listener_port: int, admin_port: int,
    timeout: float = 15.0,
) -> Envoy:
    """Run Envoy on `config` (already rewritten to free ports) and wait for admin /ready."""
    base_id = random.randint(1, 10**8)  # own shared-memory / hot-restart namespace per process
    config_path = workdir / f"envoy-{listener_port}.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    log_path = workdir / f"envoy-{listener_port}.log"
    cmd = [binary, "-c", str(config_path), "--base-id", str(base_id), "--concurrency", "1",
           "--log-level", "warning"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    envoy = Envoy(proc, listener_port, admin_port, log_path, base_id, config_path)
    try:
        wait_for(envoy.ready, timeout, "Envoy admin /ready", alive=envoy.alive, log=envoy.log)
    except BaseException:
        envoy.stop()
        raise
    return envoy


# --------------------------------------------------------------------------- the chain


def api_keys(config: dict[str, Any]) -> dict[str, str]:
    """client id -> API key, read from the api_key_auth filter of the gateway config."""
    for listener in config["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for net_filter in chain["filters"]:
                for http_filter in net_filter["typed_config"].get("http_filters", []):
                    if http_filter["name"] == "envoy.filters.http.api_key_auth":
                        creds = http_filter["typed_config"]["credentials"]
                        return {c["client"]: c["key"] for c in creds}
    raise AssertionError("no envoy.filters.http.api_key_auth filter in the gateway config")


@dataclass
class Gateway:
    envoy: Envoy
    rls: Any  # tests/conftest.py RlsProcess
    backend: Backend  # the first of `backends`
    api_keys: dict[str, str]
    # Every backend endpoint, in the order of the config's ports 9001, 9002, ...
    backends: list[Backend] = field(default_factory=list)
    domain: str = "gateway"

    def call(
        self,
        path: str,
        user: str | None = None,
        method: str = "GET",
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        """A request through Envoy, authenticated as `user` (None: no API key)."""
        all_headers = dict(headers or {})
        if user is not None:
            all_headers["x-api-key"] = self.api_keys[user]
        return self.envoy.request(method, path, headers=all_headers, body=body)

    def rls_metric(self, name: str, **labels: str) -> float:
        """Sum of the rls /metrics samples called `name` whose labels include `labels`."""
        status, text = http_get_text(self.rls.http_url + "/metrics")
        assert status == 200, text
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and labels.items() <= sample.labels.items():
                    total += sample.value
        return total

    def rls_counters(self, *entries: tuple[str, str]) -> list[dict[str, Any]]:
        """rls's view of one descriptor without charging it (admin `POST /counters`).

        One dict per matched limit: used, remaining, over_limit, requests_per_unit, ...
        """
        body = json.dumps({
            "domain": self.domain,
            "descriptors": [{"entries": [{"key": k, "value": v} for k, v in entries]}],
        }).encode()
        req = urllib.request.Request(
            self.rls.http_url + "/counters", data=body, method="POST",
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=2.0) as resp:
            (result,) = json.load(resp)["results"]
        return result["limits"]

    def rls_used(self, *entries: tuple[str, str]) -> int:
        """`used` of the single limit matching this descriptor."""
        limits = self.rls_counters(*entries)
        assert len(limits) == 1, limits
        return int(limits[0]["used"])

    def logs(self) -> str:
        return f"--- envoy ---\n{self.envoy.log()}\n--- rls ---\n{self.rls.log()}"


def start_gateway(
    binary: str, config: dict[str, Any], workdir: Path, rls: Any, upstreams: list[Backend],
    started: list[Envoy], extra_ports: dict[int, int] | None = None,
) -> Gateway:
    """Envoy on `config` in front of `rls` and `upstreams`, returned once the chain answers.

    The config's listener and admin ports move to free ports, its rls port to `rls`, its backend
    ports 9001, 9002, ... to `upstreams` (`extra_ports` maps any others). The Envoy is appended
    to `started` before the readiness wait so the caller's teardown stops it even if that fails.

    Readiness of the whole chain, not just of Envoy: Envoy opens its HTTP/2 connection to rls
    lazily, and a first call slower than the filter timeout would fail open (200 without
    x-ratelimit headers). Poll until a request comes back with rls's verdict. The warm-up path
    has its own counters, so the tests' counters start untouched.
    """
    listener_port, admin_port = free_port(), free_port()
    config = rewrite_ports(config, {
        LISTENER_PORT: listener_port,
        ADMIN_PORT: admin_port,
        RLS_PORT: rls.grpc_port,
        **{BACKEND_PORT + i: b.port for i, b in enumerate(upstreams)},
        **(extra_ports or {}),
    })
    envoy = start_envoy(binary, config, workdir, listener_port, admin_port)
    started.append(envoy)
    gw = Gateway(envoy, rls, upstreams[0], api_keys(config), backends=upstreams)
    user = next(iter(gw.api_keys))
    wait_for(
        lambda: "x-ratelimit-limit" in gw.call(WARMUP_PATH, user).headers,
        15.0, "a rate-limited answer through Envoy -> rls", alive=envoy.alive, log=gw.logs,
    )
    return gw
