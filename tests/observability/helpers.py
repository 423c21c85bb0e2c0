"""A known workload for the observability tests: who is over, and in which order."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import grpc
from envoy.service.ratelimit.v3 import rls_pb2_grpc
from support.calls import descriptor, request

DOMAIN = "obs"
CONFIG = """
domain: obs
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: team                   # never limited by the workload: must not show up in /top
    rate_limit: {unit: hour, requests_per_unit: 1000}
"""
# Calls per user against 5/hour: alice 25 over, bob 10, carol 3; dave reaches the limit
# exactly (one near hit, never over).
CALLS = {"alice": 30, "bob": 15, "carol": 8, "dave": 5}
EXPECTED_OVER = [("user=alice", 25), ("user=bob", 10), ("user=carol", 3)]


def write_config(directory: Path) -> Path:
    path = directory / "obs.yaml"
    path.write_text(CONFIG)
    return path


def run_workload(grpc_addr: str, fresh_channels: bool = False) -> None:
    """The calls of CALLS (in a shuffled-free, deterministic order), plus unlimited traffic.

    `fresh_channels`: a new connection per call, so SO_REUSEPORT spreads the calls over the
    workers of `--workers N`."""
    channel = None if fresh_channels else grpc.insecure_channel(grpc_addr)
    try:
        for user, count in CALLS.items():
            for _ in range(count):
                ch = channel or grpc.insecure_channel(
                    grpc_addr, options=[("grpc.use_local_subchannel_pool", 1)]
                )  # grpc shares connections between channels unless told not to
                try:
                    stub = rls_pb2_grpc.RateLimitServiceStub(ch)
                    stub.ShouldRateLimit(
                        request(DOMAIN, descriptor(("user", user)),
                                descriptor(("team", "edge"))),
                        timeout=10,
                    )
                finally:
                    if channel is None:
                        ch.close()
    finally:
        if channel is not None:
            channel.close()


def get_json(url: str, token: str | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def worker_files(supervisor_pid: int) -> list[Path]:
    """The top-*.json files in the shared dir of a `--workers` supervisor (from a child's env)."""
    child = Path(f"/proc/{supervisor_pid}/task/{supervisor_pid}/children").read_text().split()[0]
    env = dict(
        item.split("=", 1)
        for item in Path(f"/proc/{child}/environ").read_text().split("\0")
        if "=" in item
    )
    return sorted(Path(env["RLS_SHARED_DIR"]).glob("top-*.json"))


def over_rows(payload: dict[str, Any]) -> list[tuple[str, int]]:
    return [(row["descriptor"], row["over"]) for row in payload["domains"].get(DOMAIN, [])]
