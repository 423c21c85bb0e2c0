"""Talking to a running `rls serve`: gRPC ShouldRateLimit, admin counter queries, metrics."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf.wrappers_pb2 import UInt64Value
from prometheus_client.parser import text_string_to_metric_families

from rls.config.loader import load_files
from rls.config.matcher import match
from rls.core.keys import counter_key
from rls.stores.windows import plain_window, window_key

OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT

# The flags every test passes: a deadline far above loopback latency, so a missed deadline means
# a failing store, not a slow machine.
TIMEOUT_MS = 500
# A failure-mode answer must come within the backend deadline plus this much (gRPC, scheduling).
SLACK_S = 0.5


def rls_args(url: str, *extra: str) -> tuple[str, ...]:
    return ("--redis-url", url, "--backend-timeout-ms", str(TIMEOUT_MS), *extra)


def write_config(tmp_path: Path, text: str, name: str = "limits.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def key_of(config_text: str, domain: str, entries: list[tuple[str, str]],
           prefix: str = "rl:") -> str:
    """The Redis key rls uses now for the (single) limit matched by `entries`: a plain fixed
    window's counter is in its current window's own key (rls/stores/windows.py)."""
    config = load_files([("topology.yaml", config_text)])
    path = match(config.domains[domain], entries)
    assert path is not None, entries
    (limit,) = path[-1].limits
    key = counter_key(prefix, domain, entries, limit.ident)
    if plain_window(limit):
        return window_key(key, limit.window_ms, int(time.time() * 1000))
    return key


def desc(*entries: tuple[str, str], hits: int | None = None) -> ratelimit_pb2.RateLimitDescriptor:
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        d.hits_addend.CopyFrom(UInt64Value(value=hits))
    return d


@dataclass
class Answer:
    resp: rls_pb2.RateLimitResponse
    seconds: float  # wall time of the call
    sent_at: float  # time.monotonic() when sent

    @property
    def code(self) -> int:
        return self.resp.overall_code

    @property
    def decided(self) -> bool:
        """Decided (by the store or the local over-limit cache): some status names its limit.
        A failure-mode answer carries only bare statuses (no current_limit), whatever its code."""
        return any(s.HasField("current_limit") for s in self.resp.statuses)


class Client:
    def __init__(self, addr: str, domain: str) -> None:
        self.domain = domain
        self.channel = grpc.insecure_channel(addr)
        self.stub = rls_pb2_grpc.RateLimitServiceStub(self.channel)

    def call(self, *descs: ratelimit_pb2.RateLimitDescriptor, hits: int = 0,
             timeout: float = 10.0) -> Answer:
        req = rls_pb2.RateLimitRequest(domain=self.domain, descriptors=list(descs),
                                       hits_addend=hits)
        sent = time.monotonic()
        resp = self.stub.ShouldRateLimit(req, timeout=timeout)
        return Answer(resp, time.monotonic() - sent, sent)

    def close(self) -> None:
        self.channel.close()


def post_json(url: str, body: object, timeout: float = 5.0) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def used(http_url: str, domain: str, *entries: tuple[str, str]) -> list[int]:
    """`used` of the first limit of each single-entry descriptor, via POST /counters."""
    body = {
        "domain": domain,
        "descriptors": [{"entries": [{"key": k, "value": v}]} for k, v in entries],
    }
    status, out = post_json(http_url + "/counters", body)
    assert status == 200, (status, out)
    return [r["limits"][0]["used"] for r in out["results"]]


def metric(http_url: str, family: str, **labels: str) -> float:
    """Sum of the samples of `family` (name without _total) matching `labels`."""
    with urllib.request.urlopen(http_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    total = 0.0
    for fam in text_string_to_metric_families(text):
        if fam.name != family:
            continue
        for sample in fam.samples:
            if sample.name.endswith("_total") and all(
                sample.labels.get(k) == v for k, v in labels.items()
            ):
                total += sample.value
    return total


def backend_errors(http_url: str) -> float:
    return metric(http_url, "rls_backend_errors", backend="redis")


def start_rls(rls_factory: Callable[..., Any], config: Path, url: str, *extra: str,
              timeout: float = 30.0, ready: bool = True,
              env: dict[str, str] | None = None) -> Any:
    """`rls serve` on `url` with the standard flags; fails at once (with its log) if it exits.

    Waits for /healthcheck 200 (the store accepted rls), or with `ready=False` only for the
    admin listener (/metrics), for stores that refuse rls. The timeout is generous because
    importing rls alone took 5 s on a loaded 2-CPU machine."""
    probe = "/healthcheck" if ready else "/metrics"
    rls = rls_factory(config, args=rls_args(url, *extra), env=env, wait_healthy=False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if rls.proc.poll() is not None:
            raise AssertionError(
                f"rls exited with {rls.proc.returncode} on --redis-url {url}:\n{rls.log()}"
            )
        try:
            with urllib.request.urlopen(rls.http_url + probe, timeout=1) as resp:
                if resp.status == 200:
                    return rls
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"rls did not become healthy on --redis-url {url}:\n{rls.log()}")
