"""The cache through a real Envoy 1.40 (envoy/gateway-cache.yaml, ports rewritten), the ExtProc
servicer, Redis and a counting backend. Every wait polls a condition (never a blind sleep)."""

from __future__ import annotations

import subprocess
import threading

from rls.cache.cli import purge

from .conftest import Stack
from .harness import GATEWAY, Response, poll

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


def test_post_miss_then_hit(stack: Stack) -> None:
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


def test_purge_starts_a_new_namespace(stack: Stack) -> None:
    translate(stack)
    stack.wait_stored("translate")
    assert translate(stack).headers["x-cache"] == "HIT"

    assert purge(stack.server.admin_url, "translate", None) == 0
    assert translate(stack).headers["x-cache"] == "MISS"
    stack.wait_stored("translate", 2)  # the old entry stays until its TTL, unreachable
    assert translate(stack).headers["x-cache"] == "HIT"
    assert stack.backend.calls == 2
    assert purge(stack.server.admin_url, "nope", None) == 1


def test_ttl_is_refreshed_on_hit(stack: Stack) -> None:
    r = stack.client()
    assert stack.call("GET", "/items?page=7").headers["x-cache"] == "MISS"
    stack.wait_stored("items")
    [key] = stack.entries("items")
    assert 55_000 < r.pttl(key) <= 60_000
    r.pexpire(key, 5_000)
    assert stack.call("GET", "/items?page=7").headers["x-cache"] == "HIT"
    poll(lambda: r.pttl(key) > 55_000, 5, "TTL pushed back to 60 s after the hit")


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
            assert reply.headers["x-cache"] == "MISS", name
    assert stack.backend.calls == 2 * len(cases)
    assert stack.entries("translate") == []


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
            assert reply.headers["x-cache"] == "MISS"
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
        assert reply.headers["x-cache"] == "MISS"
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


def test_uncached_routes_are_not_touched(stack: Stack) -> None:
    for _ in range(2):
        reply = stack.call("GET", "/other")
        assert reply.status == 200
        assert "x-cache" not in reply.headers
    assert stack.backend.calls == 2
    assert stack.call("POST", "/items", body=b"x").headers.get("x-cache") is None  # GET only


def test_store_down_requests_still_succeed(stack: Stack) -> None:
    from conftest import start_redis

    port = stack.redis.port
    stack.redis.stop()
    try:
        for _ in range(5):
            reply = translate(stack, key="down")
            assert reply.status == 200, stack.logs()
            assert "x-cache" not in reply.headers
        assert stack.backend.calls == 5
        assert stack.server.metric("rls_cache_errors_total") >= 1
    finally:
        stack.redis = start_redis(port=port)
    # Back by itself once the store answers again (after the down-marking expires).
    poll(lambda: translate(stack, key="up").headers.get("x-cache") == "MISS", 10,
         "the cache working again after Redis restarted", stack.logs)
