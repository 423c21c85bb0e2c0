"""The cache through a real Envoy 1.40 (envoy/gateway-cache.yaml, ports rewritten), the ExtProc
servicer, a counting backend, and a real store: tests taking `any_stack` run on Redis and on a
real SSDB 1.9.8, the others on Redis. Every wait polls a condition (never a blind sleep)."""

from __future__ import annotations

import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from rls.cli.cache import purge

from .conftest import Stack
from .harness import GATEWAY, Response, poll
from .stores import SSDB_SAFE, SsdbStore

pytestmark = pytest.mark.envoy

TEXT = b'{"q": "hello world", "to": "fr"}'


def translate(stack: Stack, body: bytes = TEXT, key: str | None = "k1",
              headers: dict[str, str] | None = None) -> Response:
    extra = {"x-cache-key": key} if key is not None else {}
    return stack.call("POST", "/translate", {**extra, **(headers or {})}, body)


def test_gateway_cache_config_validates(envoy_binary: str) -> None:
    result = subprocess.run([envoy_binary, "--mode", "validate", "-c", str(GATEWAY)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"configuration '{GATEWAY}' OK" in result.stdout + result.stderr


def test_post_miss_then_hit(any_stack: Stack) -> None:
    stack = any_stack
    first = translate(stack)
    assert first.status == 200, stack.logs()
    assert first.headers["x-cache"] == "MISS"
    assert stack.backend.calls == 1
    stack.wait_stored("translate")

    second = translate(stack)
    assert second.status == 200
    assert second.headers["x-cache"] == "HIT"
    assert int(second.headers["age"]) >= 0
    assert second.body == first.body
    assert second.headers["content-type"] == "application/json; charset=utf-8"  # not appended
    assert second.headers["x-backend"] == "yes"
    assert "keep-alive" not in second.headers
    assert "x-envoy-upstream-service-time" not in second.headers
    assert stack.backend.calls == 1
    assert stack.server.metric("rls_cache_hits_total", api="translate") >= 1


def test_different_body_or_extra_key_misses(stack: Stack) -> None:
    assert translate(stack).headers["x-cache"] == "MISS"
    stack.wait_stored("translate")
    assert translate(stack).headers["x-cache"] == "HIT"
    assert translate(stack, body=b'{"q": "other"}').headers["x-cache"] == "MISS"
    assert translate(stack, key="k2").headers["x-cache"] == "MISS"
    assert translate(stack, key=None).headers["x-cache"] == "MISS"
    assert stack.backend.calls == 4


def test_purge_starts_a_new_namespace(any_stack: Stack) -> None:
    stack = any_stack
    translate(stack)
    stack.wait_stored("translate")
    assert translate(stack).headers["x-cache"] == "HIT"

    assert purge(stack.server.admin_url, "translate", None) == 0
    assert translate(stack).headers["x-cache"] == "MISS"
    stack.wait_stored("translate", 2)  # the old entry stays until its TTL, unreachable
    assert translate(stack).headers["x-cache"] == "HIT"
    assert stack.backend.calls == 2
    assert purge(stack.server.admin_url, "nope", None) == 1


def test_ttl_is_set_and_refreshed_on_hit(any_stack: Stack) -> None:
    stack, store = any_stack, any_stack.store
    assert stack.call("GET", "/items?page=7").headers["x-cache"] == "MISS"
    stack.wait_stored("items")
    [key] = stack.entries("items")
    assert 55 <= store.ttl(key) <= 60  # whole seconds: SSDB has no PTTL
    store.expire(key, 5)
    assert store.ttl(key) <= 5
    assert stack.call("GET", "/items?page=7").headers["x-cache"] == "HIT"
    poll(lambda: store.ttl(key) >= 55, 5, "TTL pushed back to 60 s after the hit")
    stack.wait_writer_idle()
    assert stack.metric("rls_cache_refreshes_total", api="items") >= 1


def test_long_request_parts_give_bounded_keys(any_stack: Stack) -> None:
    # SSDB refuses keys over 255 bytes (and reads them as misses): the key is a digest.
    stack = any_stack
    long_query = "/items?q=" + "x" * 8000
    long_key = "k" * 4000
    assert stack.call("GET", long_query).headers["x-cache"] == "MISS"
    assert translate(stack, key=long_key).headers["x-cache"] == "MISS"
    stack.wait_stored("items")
    stack.wait_stored("translate")
    assert stack.call("GET", long_query).headers["x-cache"] == "HIT"
    assert translate(stack, key=long_key).headers["x-cache"] == "HIT"
    keys = stack.store.keys("t:")
    assert keys and all(len(k) <= 255 for k in keys)
    assert stack.backend.calls == 2

def test_vary_keeps_variants_apart(stack: Stack) -> None:
    vary = {"x-test-header": "vary: Accept-Language"}

    def get(lang: str) -> Response:
        return stack.call("GET", "/items?page=1", {"accept-language": lang, **vary})

    en = get("en")
    assert en.headers["x-cache"] == "MISS"
    stack.wait_stored("items", 2)  # pointer + entry
    assert get("en").headers["x-cache"] == "HIT"
    de = get("de")
    assert de.headers["x-cache"] == "MISS"
    stack.wait_stored("items", 3)
    hit = get("de")
    assert hit.headers["x-cache"] == "HIT"
    assert hit.body == de.body != en.body
    assert stack.backend.calls == 2


def test_never_stored_responses_go_upstream_every_time(stack: Stack) -> None:
    cases = {
        "set-cookie": {"x-test-header": "set-cookie: session=1"},
        "no-store": {"x-test-header": "cache-control: no-store"},
        "private": {"x-test-header": "cache-control: private, max-age=60"},
        "status": {"x-test-status": "201"},
        "vary": {"x-test-header": "vary: x-other"},
    }
    for name, headers in cases.items():
        for _ in range(2):
            reply = translate(stack, key=name, headers=headers)
            assert reply.status in (200, 201)
            assert reply.headers["x-cache"] == "BYPASS", name
    assert stack.backend.calls == 2 * len(cases)
    assert stack.entries("translate") == []
    for reason in ("set_cookie", "no_store", "private", "status", "vary"):
        assert stack.metric("rls_cache_bypasses_total", reason=reason) >= 2, reason


def ext_proc_messages(stack: Stack) -> int:
    name = "http.gateway.ext_proc.stream_msgs_sent"
    return stack.envoy.stats(name).get(name, 0)


def test_large_post_responses_pass_through_unbuffered(stack: Stack) -> None:
    # Behind the buffer filter a POST's stream buffer limit is 64 KiB, for the response too:
    # had the body been asked for at request time, every response over 64 KiB would be a 500.
    # The servicer asks for it only at the response headers, when it knows the size fits.
    for size, chunked in ((200_000, False), (2_000_000, False), (200_000, True)):
        headers = {"x-test-size": str(size), **({"x-test-chunked": "1"} if chunked else {})}
        for _ in range(2):
            before = ext_proc_messages(stack)
            reply = translate(stack, key=f"big-{size}-{chunked}", headers=headers)
            assert reply.status == 200, stack.logs()
            assert len(reply.body) == size
            assert reply.headers["x-cache"] == "BYPASS"
            # request headers, request body, response headers; the body is never sent to rls
            assert ext_proc_messages(stack) - before == 3
    assert stack.backend.calls == 6
    assert stack.entries("translate") == []
    assert stack.server.metric("rls_cache_bypasses_total", reason="too_large") >= 4
    assert stack.server.metric("rls_cache_bypasses_total", reason="unknown_length") >= 2


def test_post_response_within_the_limit_is_cached(stack: Stack) -> None:
    headers = {"x-test-size": "60000"}
    assert translate(stack, key="60k", headers=headers).headers["x-cache"] == "MISS"
    stack.wait_stored("translate")
    hit = translate(stack, key="60k", headers=headers)
    assert hit.headers["x-cache"] == "HIT"
    assert len(hit.body) == 60000
    assert stack.backend.calls == 1


def test_buffered_body_over_max_entry_bytes_is_refused(stack: Stack) -> None:
    # items buffers chunked bodies (unknown_length: buffer) and this Envoy's buffer limit is
    # raised to 4 MiB: the 2 MB body reaches the servicer whole, which must not store it.
    headers = {"x-test-size": "2000000", "x-test-chunked": "1"}
    for _ in range(2):
        before = ext_proc_messages(stack)
        reply = stack.call("GET", "/items?page=big", headers)
        assert reply.status == 200, stack.logs()
        assert len(reply.body) == 2_000_000
        # MISS at the headers, replaced from the body reply: Envoy held the buffered headers
        assert reply.headers["x-cache"] == "BYPASS"
        assert ext_proc_messages(stack) - before == 3  # request headers, response headers, body
    assert stack.entries("items") == []
    small = {"x-test-size": "5000", "x-test-chunked": "1"}
    assert stack.call("GET", "/items?page=small", small).headers["x-cache"] == "MISS"
    stack.wait_stored("items")
    assert stack.call("GET", "/items?page=small", small).headers["x-cache"] == "HIT"
    assert stack.backend.calls == 3


def test_concurrent_identical_misses_are_coalesced(stack: Stack) -> None:
    slow = {"x-test-delay-ms": "400"}
    first: list[Response] = []
    thread = threading.Thread(target=lambda: first.append(translate(stack, key="c", headers=slow)))
    thread.start()
    poll(lambda: stack.backend.calls == 1, 5, "the first request reaching the backend")
    second = translate(stack, key="c", headers=slow)  # waits for the first one's fill
    thread.join(10)
    assert first[0].headers["x-cache"] == "MISS"
    assert second.status == 200
    assert second.headers["x-cache"] == "HIT"
    assert second.body == first[0].body
    assert stack.backend.calls == 1
    assert stack.server.metric("rls_cache_coalesced_total", result="hit") >= 1


def test_uncached_routes_skip_the_filter_and_other_methods_bypass(stack: Stack) -> None:
    for _ in range(2):
        reply = stack.call("GET", "/other")  # ext_proc disabled on the route
        assert reply.status == 200
        assert "x-cache" not in reply.headers
    assert stack.backend.calls == 2
    before = stack.metric("rls_cache_bypasses_total", reason="method")
    assert stack.call("POST", "/items", body=b"x").headers["x-cache"] == "BYPASS"  # GET only
    assert stack.metric("rls_cache_bypasses_total", reason="method") == before + 1


def test_store_killed_requests_pass_upstream_marked_bypass(any_stack: Stack) -> None:
    stack, store = any_stack, any_stack.store
    assert translate(stack, key="before").headers["x-cache"] == "MISS"
    stack.wait_stored("translate")
    store.kill()
    for _ in range(5):
        reply = translate(stack, key="down")
        assert reply.status == 200, stack.logs()
        assert reply.headers["x-cache"] == "BYPASS"
    assert stack.backend.calls == 6
    assert stack.metric("rls_cache_errors_total") >= 1
    assert stack.metric("rls_cache_bypasses_total", reason="store_down") >= 1
    store.start()
    # Back by itself once the store answers again (after the down-marking expires).
    poll(lambda: translate(stack, key="up").headers.get("x-cache") == "MISS", 10,
         "the cache working again after the store restarted", stack.logs)
    stack.wait_stored("translate")
    assert translate(stack, key="up").headers["x-cache"] == "HIT"
    # SSDB writes to its LevelDB log before it answers: a SIGKILL lost nothing.
    expected = "HIT" if isinstance(store, SsdbStore) else "MISS"  # Redis here: no persistence
    assert translate(stack, key="before").headers["x-cache"] == expected


def test_store_frozen_requests_pass_upstream_within_the_deadline(any_stack: Stack) -> None:
    stack, store = any_stack, any_stack.store
    timeouts = stack.ext_proc_stat("message_timeouts")
    allowed = stack.ext_proc_stat("failure_mode_allowed")
    store.freeze()  # SIGSTOP: connections open, nothing answers
    try:
        for i in range(5):
            reply = translate(stack, key=f"frozen-{i}")
            assert reply.status == 200, stack.logs()
            # Marked by rls: it answered Envoy within the message timeout (had it not, Envoy
            # would have gone on without the header, counting a timeout).
            assert reply.headers["x-cache"] == "BYPASS"
    finally:
        store.thaw()
    assert stack.ext_proc_stat("message_timeouts") == timeouts
    assert stack.ext_proc_stat("failure_mode_allowed") == allowed
    assert stack.backend.calls == 5
    assert stack.metric("rls_cache_bypasses_total", reason="store_error") >= 1
    poll(lambda: translate(stack, key="thawed").headers.get("x-cache") == "MISS", 10,
         "the cache working again after the store was thawed", stack.logs)


def test_store_restart_keeps_or_loses_entries_as_the_store_does(any_stack: Stack) -> None:
    stack, store = any_stack, any_stack.store
    assert translate(stack, key="kept").headers["x-cache"] == "MISS"
    stack.wait_stored("translate")
    store.stop()  # SIGTERM: a clean stop
    store.start()
    seen: list[str] = []

    def answered_from_the_store() -> bool:  # the first calls may meet a dropped connection
        value = translate(stack, key="kept").headers["x-cache"]
        seen.append(value)
        return value != "BYPASS"

    poll(answered_from_the_store, 10, "the cache answering after the restart", stack.logs)
    # SSDB is disk-backed and keeps the entry; this Redis runs without persistence.
    assert seen[-1] == ("HIT" if isinstance(store, SsdbStore) else "MISS")
    stack.wait_stored("translate")
    assert translate(stack, key="kept").headers["x-cache"] == "HIT"


def burst(stack: Stack, bodies: list[bytes]) -> list[Response]:
    """All requests at once: one thread each, released together."""
    gate = threading.Barrier(len(bodies))

    def one(body: bytes) -> Response:
        gate.wait(10)
        return translate(stack, body=body, key="burst")

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(one, bodies))


def test_100_concurrent_misses_are_all_stored_then_all_hit(any_stack: Stack) -> None:
    stack, n = any_stack, 100
    stack.wait_writer_idle()
    names = ("cacheable_misses", "stores", "store_failures", "hits", "refreshes",
             "refresh_failures", "writes_dropped")
    before = {k: stack.metric(f"rls_cache_{k}_total") for k in names}

    def delta(name: str) -> float:
        return stack.metric(f"rls_cache_{name}_total") - before[name]

    ssdb = stack.store if isinstance(stack.store, SsdbStore) else None
    log_from = ssdb.log_offset() if ssdb else 0
    bodies = [b'{"q": "text %d", "to": "fr"}' % i for i in range(n)]

    first = burst(stack, bodies)
    assert [r.status for r in first] == [200] * n, stack.logs()
    assert [r.headers.get("x-cache") for r in first] == ["MISS"] * n, stack.logs()
    stack.wait_writer_idle()
    assert delta("cacheable_misses") == n
    assert (delta("stores"), delta("store_failures"), delta("writes_dropped")) == (n, 0, 0)

    second = burst(stack, bodies)
    assert [r.headers.get("x-cache") for r in second] == ["HIT"] * n, stack.logs()
    assert [r.body for r in second] == [r.body for r in first]
    stack.wait_writer_idle()
    assert delta("hits") == n
    assert (delta("refreshes"), delta("refresh_failures"), delta("writes_dropped")) == (n, 0, 0)
    assert stack.backend.calls == n
    if ssdb is not None:  # what rls sent SSDB, as SSDB logged it (SETEX arrives as setx)
        sent = ssdb.commands_since(log_from)
        assert set(sent) <= SSDB_SAFE, sorted(set(sent) - SSDB_SAFE)
        assert sent.count("setx") == n and sent.count("expire") == n
    assert len(stack.entries("translate")) == n
