"""`rls demo` start-up, one step after the other: plan the ports, the backend, rls, Envoy.

Each part is waited for until it answers, and the demo counts as up only when a request
through Envoy comes back with rls's verdict (quota mode: when Envoy's quota stream to rls is
open). If any step fails, everything started so far is stopped and the work directory removed.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from rls.demo.backend import start_backend
from rls.demo.client import request, wait_for
from rls.demo.descriptors import descriptor_files, with_quota_descriptors
from rls.demo.envoy_config import (
    api_keys,
    backend_ports,
    find_envoy,
    load_envoy_config,
    rewrite_ports,
)
from rls.demo.errors import DemoError
from rls.demo.paths import default_envoy_config
from rls.demo.ports import choose_ports
from rls.demo.processes import Child, Demo, spawn
from rls.settings.environment import process_env

READY_PATH = "/__demo_ready"  # own counters: the readiness probe never eats a demo quota
READY_CLIENT = "__demo_ready"  # quota mode: its own bucket and counter


def start(args: argparse.Namespace) -> Demo:
    """Everything up and answering, or an exception with nothing left running."""
    envoy = find_envoy(args.envoy)
    files = descriptor_files(Path(args.config))
    cache_rules = _cache_rules(args)
    config = load_envoy_config(Path(
        args.envoy_config or default_envoy_config(cache=args.cache, quota=args.quota)))
    demo = _plan(args, config)
    try:
        for port in demo.backends:
            demo.servers.append(start_backend(port))
        rls = _start_rls(demo, args, files, cache_rules)
        proxy = _start_envoy(demo, envoy, config, args.timeout)
        if args.quota:
            _wait_for_quota_stream(demo, rls, proxy, args.timeout)
        else:
            _wait_for_rate_limited_answer(demo, rls, proxy, args.timeout)
    except BaseException:
        demo.stop()
        shutil.rmtree(demo.workdir, ignore_errors=True)
        raise
    return demo


def _cache_rules(args: argparse.Namespace) -> Path:
    """CONFIG/cache.yaml, checked when `--cache` needs it; the modes exclude each other."""
    cache_rules = Path(args.config) / "cache.yaml"
    if args.cache and args.quota:
        raise DemoError("--cache and --quota are separate demos: pick one")
    if args.cache and not cache_rules.is_file():
        raise DemoError(f"--cache: no cache rules file {cache_rules}")
    return cache_rules


def _plan(args: argparse.Namespace, config: dict[str, Any]) -> Demo:
    """Pick the ports, move the Envoy config onto them (in place), make the work directory."""
    upstream = backend_ports(config)
    ports = choose_ports(args, len(upstream))
    rewrite_ports(config, ports.mapping(upstream))
    workdir = Path(tempfile.mkdtemp(prefix="rls-demo-"))
    return Demo(ports.listener, ports.envoy_admin, ports.grpc, ports.http, ports.backends,
                api_keys(config), workdir, cache=args.cache, extproc=ports.extproc)


def _start_rls(demo: Demo, args: argparse.Namespace, files: list[Path],
               cache_rules: Path) -> Child:
    """`rls serve` on the memory backend with the descriptor files, up to /healthcheck 200."""
    env = {k: v for k, v in process_env().items()
           if not k.startswith("RLS_") and k != "REDIS_URL"}  # memory backend, defaults
    cmd = [sys.executable, "-m", "rls", "serve",
           "--grpc-addr", f"127.0.0.1:{demo.grpc}", "--http-addr", f"127.0.0.1:{demo.http}"]
    if args.quota:
        files = with_quota_descriptors(files, demo.workdir)
    for path in files:
        cmd += ["--config", str(path)]
    if args.cache:
        # The demo's store is this process's memory whatever the rules file says.
        cmd += ["--cache-config", str(cache_rules), "--cache-store", "memory://",
                "--extproc-addr", f"127.0.0.1:{demo.extproc}"]
    rls = spawn("rls", cmd, demo.workdir, env)
    demo.children.append(rls)
    print(f"rls: {' '.join(p.name for p in files)} (memory backend"
          f"{', response cache ' + cache_rules.name if args.cache else ''})", flush=True)
    wait_for("rls /healthcheck",
             lambda: request(demo.http, "GET", "/healthcheck").status == 200,
             timeout=args.timeout, alive=rls.alive, log=rls.log)
    return rls


def _start_envoy(demo: Demo, envoy: str, config: dict[str, Any], timeout: float) -> Child:
    """Envoy on the rewritten config (written next to the logs), up to admin /ready 200."""
    envoy_yaml = demo.workdir / "envoy.yaml"
    envoy_yaml.write_text(yaml.safe_dump(config, sort_keys=False))
    proxy = spawn("envoy", [envoy, "-c", str(envoy_yaml), "--concurrency", "1",
                            "--base-id", str(random.randint(1, 10**8)),
                            "--log-level", "warning"], demo.workdir)
    demo.children.append(proxy)
    wait_for("Envoy admin /ready",
             lambda: request(demo.envoy_admin, "GET", "/ready").status == 200,
             timeout=timeout, alive=proxy.alive, log=proxy.log)
    return proxy


def _wait_for_quota_stream(demo: Demo, rls: Child, proxy: Child, timeout: float) -> None:
    """Envoy opens the quota stream at the first request of a bucket: send one, wait for it."""
    def stream_open() -> bool:
        return (request(demo.listener, "GET", READY_PATH,
                        {"x-client-id": READY_CLIENT}).status == 200
                and "rls_quota_streams 1.0" in request(
                    demo.http, "GET", "/metrics").body.decode())

    wait_for("the quota stream Envoy -> rls", stream_open, timeout,
             alive=lambda: proxy.alive() and rls.alive(),
             log=lambda: proxy.log() + "\n" + rls.log())


def _wait_for_rate_limited_answer(demo: Demo, rls: Child, proxy: Child,
                                  timeout: float) -> None:
    """Envoy connects to rls lazily; until then a call may fail open (no rate-limit
    headers). Ready means a request came back with rls's verdict."""
    headers = {"x-api-key": demo.key("alice")} if demo.keys else {}
    wait_for("a rate-limited answer through Envoy -> rls",
             lambda: "x-ratelimit-limit" in request(
                 demo.listener, "GET", READY_PATH, headers).headers,
             timeout, alive=lambda: proxy.alive() and rls.alive(),
             log=lambda: proxy.log() + "\n" + rls.log())
