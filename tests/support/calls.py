"""Small clients for the operations tests: gRPC calls, admin HTTP, /metrics, the `rls` CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf.wrappers_pb2 import UInt64Value
from prometheus_client.parser import text_string_to_metric_families

from support.net import http_call

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT

Entries = Sequence[tuple[str, str]]


def uid(prefix: str = "") -> str:
    """A fresh descriptor value, so tests sharing one server never share a counter."""
    return prefix + uuid.uuid4().hex[:12]


def descriptor(*entries: tuple[str, str], hits: int | None = None):
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        d.hits_addend.CopyFrom(UInt64Value(value=hits))
    return d


def request(domain: str, *descs, hits: int = 0) -> rls_pb2.RateLimitRequest:
    return rls_pb2.RateLimitRequest(domain=domain, descriptors=list(descs), hits_addend=hits)


class Grpc:
    """A blocking RateLimitService client (one channel)."""

    def __init__(self, addr: str) -> None:
        self.channel = grpc.insecure_channel(addr)
        self.stub = rls_pb2_grpc.RateLimitServiceStub(self.channel)

    def call(
        self,
        domain: str,
        *descs,
        hits: int = 0,
        metadata: Sequence[tuple[str, str]] | None = None,
    ) -> rls_pb2.RateLimitResponse:
        return self.stub.ShouldRateLimit(
            request(domain, *descs, hits=hits), timeout=10, metadata=metadata
        )

    def one(self, domain: str, *entries: tuple[str, str], hits: int = 0):
        return self.call(domain, descriptor(*entries), hits=hits)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Grpc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def http(
    base: str,
    method: str,
    path: str,
    body: Any = None,
    *,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
    timeout: float = 10.0,
) -> tuple[int, Any]:
    """One admin call on a fresh connection. JSON bodies in and out when possible; HTTP
    errors are returned, not raised."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    sent = {"Content-Type": "application/json"} if data is not None else {}
    return http_call(base, method, path, data, {**sent, **(headers or {})}, timeout)


def query(base: str, domain: str, *descriptors: Entries) -> tuple[int, Any]:
    """POST /counters for the given descriptors (entry lists)."""
    return http(base, "POST", "/counters", counters_body(domain, *descriptors))


def counters_body(domain: str, *descriptors: Entries) -> dict[str, Any]:
    return {
        "domain": domain,
        "descriptors": [
            {"entries": [{"key": k, "value": v} for k, v in d]} for d in descriptors
        ],
    }


def item(domain: str, *descriptors: Entries, hits: int = 0) -> dict[str, Any]:
    """One RateLimitRequest in proto3 JSON, for POST /add."""
    body = counters_body(domain, *descriptors)
    if hits:
        body["hitsAddend"] = hits
    return body


def used(base: str, domain: str, entries: Entries) -> int:
    """`used` of the single limit a descriptor matches (POST /counters)."""
    status, payload = query(base, domain, entries)
    assert status == 200, payload
    limits = payload["results"][0]["limits"]
    assert len(limits) == 1, payload
    return limits[0]["used"]


# -- /metrics ---------------------------------------------------------------------------------


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(base: str) -> Samples:
    status, text = http(base, "GET", "/metrics")
    assert status == 200, text
    assert isinstance(text, str)
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, metric: str, /, **labels: str) -> float:
    """A sample's value; 0 when the series does not exist (counters start there)."""
    return samples.get((metric, frozenset(labels.items())), 0.0)


def delta(before: Samples, after: Samples, metric: str, /, **labels: str) -> float:
    return value(after, metric, **labels) - value(before, metric, **labels)


def has(samples: Samples, metric: str, /, **labels: str) -> bool:
    return (metric, frozenset(labels.items())) in samples


def series(samples: Samples, name: str) -> list[dict[str, str]]:
    return [dict(labels) for (n, labels) in samples if n == name]


def names(samples: Samples) -> set[str]:
    return {n for (n, _) in samples}


# -- the CLI ----------------------------------------------------------------------------------


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m rls ARGS` with a clean RLS_* environment plus `env`."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("RLS_")}
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "rls", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=full,
        cwd=str(ROOT),
    )


def descriptor_args(descriptors: Iterable[Entries]) -> list[str]:
    out: list[str] = []
    for d in descriptors:
        out += ["-d", ",".join(f"{k}={v}" for k, v in d)]
    return out
