"""Small clients shared by the ship tests: gRPC ShouldRateLimit, admin HTTP JSON, windows."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf.wrappers_pb2 import UInt64Value

ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = ROOT / "config"

OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT

Entries = Sequence[tuple[str, str]]


def scenario(name: str) -> Path:
    return CONFIG_DIR / f"scenario-{name}.yaml"


def descriptor(entries: Entries, hits: int | None = None) -> ratelimit_pb2.RateLimitDescriptor:
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        d.hits_addend.CopyFrom(UInt64Value(value=hits))
    return d


class RlsClient:
    """gRPC client of one `rls serve` (the same calls Envoy makes)."""

    def __init__(self, addr: str) -> None:
        self.channel = grpc.insecure_channel(addr)
        self.stub = rls_pb2_grpc.RateLimitServiceStub(self.channel)

    def call(
        self, domain: str, *descs: ratelimit_pb2.RateLimitDescriptor, hits: int = 0
    ) -> rls_pb2.RateLimitResponse:
        req = rls_pb2.RateLimitRequest(domain=domain, descriptors=list(descs), hits_addend=hits)
        return self.stub.ShouldRateLimit(req, timeout=10)

    def close(self) -> None:
        self.channel.close()


def admin(base: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One admin API call; JSON in and out; HTTP errors returned, not raised."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, raw.decode(errors="replace")


def rl_request(domain: str, entries_list: Iterable[Entries], hits: int = 0) -> dict[str, Any]:
    """A RateLimitRequest in proto3 JSON (admin /add items, /counters body)."""
    item: dict[str, Any] = {
        "domain": domain,
        "descriptors": [
            {"entries": [{"key": k, "value": v} for k, v in entries]} for entries in entries_list
        ],
    }
    if hits:
        item["hitsAddend"] = hits
    return item


def avoid_window_edge(period_s: float, margin_s: float, offset_s: float = 0) -> None:
    """Sleep past the next epoch-aligned boundary of `period_s` if it is under `margin_s` away.

    Tests against a real server use the real clock; a fixed window rolling over in the middle
    of a story would reset its counts. This keeps the story inside one window. `offset_s`
    shifts the boundaries (8 h: midnight in Shanghai for a 1-day period).
    """
    left = period_s - (time.time() + offset_s) % period_s
    if left < margin_s:
        time.sleep(left + 0.05)
