"""`rls demo`: the whole chain on one machine (rls.demo), its flags, and a run turned into an
exit code (0 smoke passed or Ctrl-C, 1 a check failed or a part died, 2 a problem the user
can fix)."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import time
from typing import Any

from rls.cli.command import Call, SubParsers
from rls.demo.banner import banner, quota_banner
from rls.demo.errors import DemoError
from rls.demo.paths import default_config_dir
from rls.demo.ports import BACKEND_PORT, ENVOY_ADMIN_PORT, GRPC_PORT, HTTP_PORT, LISTENER_PORT
from rls.demo.processes import Demo
from rls.demo.smoke import quota_smoke, smoke
from rls.demo.startup import start

NAME = "demo"


def add_parser(sub: SubParsers) -> argparse.ArgumentParser:
    """The demo's flags; the port defaults are those of envoy/gateway.yaml."""
    p = sub.add_parser(
        NAME, help="start Envoy + rls + a tiny backend locally",
        description="Run a backend, rls (memory backend) and Envoy on this machine.",
    )
    p.add_argument("--config", default=str(default_config_dir()),
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


def run(args: argparse.Namespace, call: Call) -> int:
    """Start the demo, then smoke-test it or serve until Ctrl-C/SIGTERM; always clean up."""
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
        return _smoke(demo, quota=args.quota) if args.smoke else _serve(demo, quota=args.quota)
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


def _smoke(demo: Demo, *, quota: bool) -> int:
    """--smoke: 0 when every check passed, else 1 with the children's logs on stderr."""
    print(f"smoke test against {demo.listener} (ports: rls {demo.grpc}/{demo.http}):",
          flush=True)
    failures = quota_smoke(demo) if quota else smoke(demo)
    if failures:
        logs = "\n".join(child.log() for child in demo.children)
        print(f"smoke test FAILED: {len(failures)} check(s)\n{logs}", file=sys.stderr)
        return 1
    print("smoke test passed", flush=True)
    return 0


def _serve(demo: Demo, *, quota: bool) -> int:
    """Interactive: print the banner, run until Ctrl-C (in `main`) or a child dies (1)."""
    print(quota_banner(demo) if quota else banner(demo), flush=True)
    while all(child.alive() for child in demo.children):
        time.sleep(0.2)
    dead = [c for c in demo.children if not c.alive()]
    for child in dead:
        print(f"rls demo: {child.name} exited unexpectedly\n{child.log()}", file=sys.stderr)
    return 1
