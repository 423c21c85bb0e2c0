"""Load generation and bookkeeping for the fault tests.

Every call is made with grpc.aio from the test's event loop and recorded with its start time,
latency, the test's current phase, and a classification of the answer:

- `decided_ok` / `decided_over`: the limiter's own decision (the status carries current_limit);
- `fail_ok` / `fail_over`: the failure mode answered (no current_limit: the backend was not
  consulted in time, DESIGN §10);
- a gRPC status name (`UNAVAILABLE`, `DEADLINE_EXCEEDED`, …) when the call failed.

`summary()` turns the records into the numbers each test prints and asserts: calls answered,
answered within the deadline, wrong answers (anything outside the allowed set for the phase),
and the worst latency. The client-side timeout (2 s) only exists to turn a hang into a
recorded failure; the deadline asserted is far below it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import grpc
from conftest import RlsProcess, http_get
from envoy.service.ratelimit.v3 import rls_pb2
from prometheus_client.parser import text_string_to_metric_families

from support.waiting import wait_until as eventually  # the fault suites' name

METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
DEADLINE_S = 0.25  # backend timeout (50 ms) + generous slack for a loaded 2-core machine
HANG_S = 2.0  # client timeout: a call still unanswered by then counts as hung
OK, OVER = rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT
# Flags every fault test starts rls with (plus its own).
FAST_FAILOVER = ("--backend-timeout-ms", "50", "--probe-interval-ms", "100")


def varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def ld(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def request(domain: str, key: str, value: str) -> bytes:
    """A RateLimitRequest with one descriptor of one entry, as wire bytes."""
    entry = ld(1, key.encode()) + ld(2, value.encode())
    return ld(1, domain.encode()) + ld(2, ld(1, entry))


def classify(response: rls_pb2.RateLimitResponse) -> str:
    decided = bool(response.statuses) and response.statuses[0].HasField("current_limit")
    over = response.overall_code == OVER
    return ("decided_" if decided else "fail_") + ("over" if over else "ok")


@dataclass
class Call:
    start: float  # seconds since the Load started
    latency: float
    kind: str
    phase: str
    limit_name: str = ""
    probe: bool = False  # an exactness probe, not part of the steady load

    @property
    def label(self) -> str:
        """The kind, with the limit's name when it has one (`decided_ok:v1`)."""
        return f"{self.kind}:{self.limit_name}" if self.limit_name else self.kind


@dataclass
class Load:
    """Closed-loop load: `concurrency` workers, each sending its next call when the last one is
    answered, until stopped."""

    addr: str
    make_request: Callable[[int], bytes]
    concurrency: int = 3
    phase: str = "baseline"
    timeout: float = HANG_S  # per call, for the workers
    calls: list[Call] = field(default_factory=list)
    t0: float = 0.0

    async def __aenter__(self) -> Load:
        self.channel = grpc.aio.insecure_channel(self.addr)
        await asyncio.wait_for(self.channel.channel_ready(), 10)
        self.raw = self.channel.unary_unary(METHOD)
        self.t0 = time.monotonic()
        self._stop = asyncio.Event()
        self._counter = itertools.count()
        self._tasks = [asyncio.create_task(self._worker()) for _ in range(self.concurrency)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self.channel.close()

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def one(self, data: bytes, timeout: float = HANG_S, probe: bool = False) -> Call:
        """One call, recorded. The hang bound is the client's own: no gRPC deadline is sent,
        so rls budgets the call with its --backend-timeout-ms (a caller's deadline would be
        used instead, see stores/deadline.py)."""
        phase, start = self.phase, self.now()
        name = ""
        try:
            body = await asyncio.wait_for(self.raw(data), timeout)
            response = rls_pb2.RateLimitResponse.FromString(body)
            kind = classify(response)
            if response.statuses and response.statuses[0].HasField("current_limit"):
                name = response.statuses[0].current_limit.name
        except grpc.aio.AioRpcError as exc:
            kind = exc.code().name
        except TimeoutError:
            kind = "HUNG"
        call = Call(start, self.now() - start, kind, phase, name, probe)
        self.calls.append(call)
        return call

    async def _worker(self) -> None:
        while not self._stop.is_set():
            call = await self.one(self.make_request(next(self._counter)), self.timeout)
            if call.kind.isupper():  # a gRPC error (e.g. the server is gone): do not spin
                await asyncio.sleep(0.01)

    async def hold(self, phase: str, seconds: float) -> None:
        self.phase = phase
        await asyncio.sleep(seconds)


def summary(calls: Iterable[Call], allowed: dict[str, set[str]],
            deadline: float = DEADLINE_S) -> dict[str, object]:
    """The recorded numbers; `allowed[phase]` is the set of answer kinds that are right in it.
    Exactness probes count for answered / deadline / latency, not for `wrong` (their OVER_LIMIT
    answers are expected; `exact_cycle` checks them)."""
    calls = list(calls)
    answered = [c for c in calls if c.kind in ("decided_ok", "decided_over", "fail_ok",
                                               "fail_over")]
    wrong = [c for c in calls
             if not c.probe and c.label not in allowed.get(c.phase, set())]
    latencies = sorted(c.latency for c in calls)
    by_phase: dict[str, dict[str, int]] = {}
    for c in calls:
        by_phase.setdefault(c.phase, Counter())[c.kind] += 1  # type: ignore[index]
    return {
        "calls": len(calls),
        "answered": len(answered),
        "within_deadline": sum(1 for c in answered if c.latency <= deadline),
        "deadline_ms": round(deadline * 1000),
        "wrong": len(wrong),
        "wrong_examples": [(c.phase, c.label, round(c.start, 3)) for c in wrong[:5]],
        "max_latency_ms": round(latencies[-1] * 1000, 1) if latencies else None,
        "p99_latency_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 1)
        if latencies else None,
        "by_phase": {p: dict(k) for p, k in by_phase.items()},
    }


def report(name: str, numbers: dict[str, object]) -> None:
    """Printed (run pytest with -s to see it) and kept in the test output for the docs."""
    print(f"\nFAULT {name}: {json.dumps(numbers, sort_keys=True)}")


class KnownBug(AssertionError):
    """The expected failure of a known-defect test (xfail(strict=True, raises=KnownBug))."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise KnownBug(message)


IN_TIME_SHARE = 0.97


def assert_answered_in_time(numbers: dict[str, object], rls: RlsProcess | None = None) -> None:
    """Every call answered (none hung for HANG_S, no gRPC error), no wrong answer, and at least
    97 % within DEADLINE_S. Not 100 %: the tests share two cores with whatever else runs, and a
    scheduling stall of a few hundred ms is not a hang; the worst latency is recorded."""
    log = "" if rls is None else "\nrls log (tail):\n" + rls.log()[-4000:]
    assert numbers["answered"] == numbers["calls"], f"{numbers}{log}"
    assert numbers["wrong"] == 0, f"{numbers}{log}"
    assert numbers["within_deadline"] >= IN_TIME_SHARE * numbers["answered"], f"{numbers}{log}"


async def exact_cycle(load: Load, domain: str, key: str, value: str, limit: int) -> str:
    """`limit + 1` sequential calls on a fresh counter. "exact": decided OK `limit` times, then
    decided OVER_LIMIT. "inconclusive": some call was answered by the failure mode (a backend
    timeout, which may still have charged in Redis). "wrong": every call was decided, but not
    as the limit says — a wrong decision."""
    data = request(domain, key, value)
    kinds = [(await load.one(data, probe=True)).kind for _ in range(limit + 1)]
    if kinds == ["decided_ok"] * limit + ["decided_over"]:
        return "exact"
    if any(k.startswith("fail_") for k in kinds):
        return "inconclusive"
    return f"wrong: {kinds}"


async def exact_cycles(load: Load, domain: str, key: str, limit: int, wanted: int = 3,
                       tries: int = 20) -> dict[str, int]:
    """Run cycles until `wanted` are exact (at most `tries`); count the outcomes."""
    counts: Counter[str] = Counter()
    for n in range(tries):
        outcome = await exact_cycle(load, domain, key, f"check-{time.monotonic()}-{n}", limit)
        counts["wrong" if outcome.startswith("wrong") else outcome] += 1
        assert not outcome.startswith("wrong"), outcome
        if counts["exact"] == wanted:
            break
    return dict(counts)


async def time_to_exact(load: Load, domain: str, key: str, limit: int,
                        timeout: float = 10.0) -> float:
    """Seconds until an exact cycle succeeds. A wrong cycle fails the test at once."""
    start = time.monotonic()
    for n in itertools.count():
        outcome = await exact_cycle(load, domain, key, f"probe-{start}-{n}", limit)
        if outcome == "exact":
            return time.monotonic() - start
        assert not outcome.startswith("wrong"), outcome
        if time.monotonic() - start > timeout:
            raise AssertionError(f"decisions not exact again after {timeout} s")
        await asyncio.sleep(0.01)
    raise AssertionError("unreachable")


def start_rls(rls_factory: Callable[..., RlsProcess], *config: object,
              args: tuple[str, ...] = ()) -> RlsProcess:
    """rls_factory with a longer readiness wait (30 s): on a loaded machine the interpreter
    start alone can take several seconds."""
    rls = rls_factory(*config, args=args, wait_healthy=False)
    try:
        eventually(lambda: http_get(rls.http_url + "/healthcheck")[0] == 200, 30,
                   "rls /healthcheck 200")
    except AssertionError:
        raise AssertionError(f"rls did not become healthy:\n{rls.log()}") from None
    return rls


def metrics(http_url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, body = http_get(http_url + "/metrics")
    assert status == 200
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metric(http_url: str, name: str, **labels: str) -> float:
    return metrics(http_url).get((name, tuple(sorted(labels.items()))), 0.0)
