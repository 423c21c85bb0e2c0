"""`rls demo --smoke`: a few requests through the running demo, each check printed as it is
made; the failures decide the exit code.

The stories are per-minute limits, so each starts early enough in a minute to finish inside it.
"""

from __future__ import annotations

import json
import random
import time

from rls.demo.client import request
from rls.demo.descriptors import QUOTA_LIMIT
from rls.demo.processes import Demo


class Checks:
    """Prints each check as it is made (`ok` or `FAIL`) and keeps the failures."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def __call__(self, ok: bool, what: str) -> None:
        print(f"  {'ok  ' if ok else 'FAIL'} {what}", flush=True)
        if not ok:
            self.failures.append(what)


def _within_one_minute() -> None:
    """Keep the per-minute story inside one window: with under 10 s left, wait for the next."""
    left = 60 - time.time() % 60
    if left < 10:
        time.sleep(left + 0.1)


def smoke(demo: Demo) -> list[str]:
    """A few requests through Envoy; returns the failures (empty: all good)."""
    check = Checks()
    alice = {"x-api-key": demo.key("alice")}
    bob = {"x-api-key": demo.key("bob")}
    r = request(demo.listener, "GET", "/items")
    check(r.status == 401, f"no API key -> 401 (got {r.status})")
    _within_one_minute()
    _per_user_limit(demo, check, alice)
    _weighted_translate(demo, check, bob)
    if demo.cache:
        _cache_hit(demo, check, bob)
    metrics = request(demo.http, "GET", "/metrics").body.decode()
    over = [line for line in metrics.splitlines() if line.startswith("rls_requests_total{")
            and 'code="OVER_LIMIT"' in line and 'domain="gateway"' in line]
    check(bool(over) and float(over[0].rsplit(" ", 1)[1]) >= 1,
          "rls /metrics counts the OVER_LIMIT answers")
    return check.failures


def _per_user_limit(demo: Demo, check: Checks, alice: dict[str, str]) -> None:
    """alice gets 30 calls per minute on /items with rate-limit headers, then a 429."""
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


def _weighted_translate(demo: Demo, check: Checks, bob: dict[str, str]) -> None:
    """bob's POST /translate is charged its size as hits (rls's /counters shows 5000 used)."""
    # --cache: config/cache.yaml `hits_from: json:payload`; else %BYTES_RECEIVED% (gateway.yaml)
    body, what = ((json.dumps({"payload": "x" * 5000, "id": time.time_ns()}).encode(),
                   "a JSON payload of 5000 characters") if demo.cache
                  else (b"x" * 5000, "5000 bytes"))
    r = request(demo.listener, "POST", "/translate", bob, body)
    check(r.status == 200, f"bob POST /translate with {what} -> 200 (got {r.status})")
    query = json.dumps({"domain": "gateway", "descriptors": [
        {"entries": [{"key": "api", "value": "translate"}, {"key": "user", "value": "bob"}]}]})
    answer = json.loads(request(demo.http, "POST", "/counters",
                                {"content-type": "application/json"}, query.encode()).body)
    used = [limit["used"] for limit in answer["results"][0]["limits"]]
    check(used == [5000], f"rls charged {what}: used {used} (admin /counters)")


def _cache_hit(demo: Demo, check: Checks, bob: dict[str, str]) -> None:
    """--cache: the second GET of a fresh page is answered from rls's cache."""
    page = f"/items?page=smoke-{time.time_ns()}"
    first = request(demo.listener, "GET", page, bob)
    second = request(demo.listener, "GET", page, bob)
    check(first.status == 200 and second.headers.get("x-cache") == "HIT",
          f"cache: a repeated GET {page.split('?')[0]} is answered from rls's cache "
          f"(x-cache {first.headers.get('x-cache')} then {second.headers.get('x-cache')})")


def _quota_assignments(demo: Demo) -> float:
    """How many assignments rls has sent so far (all actions), from its /metrics."""
    text = request(demo.http, "GET", "/metrics").body.decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("rls_quota_assignments_total{"))


def quota_smoke(demo: Demo) -> list[str]:
    """Quota mode: a client gets its limit per minute from Envoy, then Envoy's 429."""
    check = Checks()
    _within_one_minute()
    client = f"smoke-{random.randint(0, 10**9)}"
    # The first request creates the client's bucket; Envoy reports it at once and rls answers
    # with an assignment. Wait for that answer (bounded) before sending the rest, so that a
    # slow machine does not turn the story into "everything passed before the answer came".
    sent = _quota_assignments(demo)
    r = request(demo.listener, "GET", "/items?smoke=0", {"x-client-id": client})
    statuses = [r.status]
    deadline = time.monotonic() + 10
    while _quota_assignments(demo) <= sent and time.monotonic() < deadline:
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
    return check.failures
