"""Admin routes (`POST /cache/purge`, `GET /cache/stats`) served by aiohttp on a free port, and
the `rls cache purge` client helper against them."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from conftest import free_port

from rls.admin.response_cache import add_cache_routes
from rls.cli.cache import purge
from rls.response_cache.cache import ResponseCache

from .helpers import make_service


@pytest.fixture
async def admin() -> AsyncIterator[tuple[str, ResponseCache]]:
    _, cache = make_service()
    app = web.Application()
    add_cache_routes(app, cache)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}", cache
    await runner.cleanup()


def call(method: str, url: str, token: str | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=b"" if method == "POST" else None, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def test_purge_and_stats(admin: tuple[str, ResponseCache],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    url, cache = admin
    monkeypatch.delenv("RLS_ADMIN_TOKEN", raising=False)
    status, body = await asyncio.to_thread(call, "POST", url + "/cache/purge?api=translate")
    assert status == 200 and body["api"] == "translate" and body["purged"]
    assert await cache.version("translate") == body["version"]
    status, body = await asyncio.to_thread(call, "POST", url + "/cache/purge?api=nope")
    assert status == 404 and body["apis"] == ["items", "translate"]
    status, body = await asyncio.to_thread(call, "POST", url + "/cache/purge")
    assert status == 400

    status, stats = await asyncio.to_thread(call, "GET", url + "/cache/stats")
    assert status == 200
    assert stats["store"] == "memory" and stats["apis"] == ["items", "translate"]
    assert stats["counters"]["purges_total"]["translate"] == 1
    assert stats["rules"][0]["ttl"] == 7 * 86400


async def test_purge_requires_the_token_when_set(admin: tuple[str, ResponseCache],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    url, _ = admin
    monkeypatch.setenv("RLS_ADMIN_TOKEN", "s3cret")
    target = url + "/cache/purge?api=translate"
    assert (await asyncio.to_thread(call, "POST", target))[0] == 401
    assert (await asyncio.to_thread(call, "POST", target, "wrong"))[0] == 401
    assert (await asyncio.to_thread(call, "POST", target, "s3cret"))[0] == 200
    assert (await asyncio.to_thread(call, "GET", url + "/cache/stats"))[0] == 200  # read-only

    # (no --token: the client sends RLS_ADMIN_TOKEN, which this process has set)
    assert await asyncio.to_thread(purge, url, "translate", "wrong") == 1
    assert await asyncio.to_thread(purge, url, "translate", "s3cret") == 0
    assert await asyncio.to_thread(purge, url, "nope", "s3cret") == 1


def test_cli_unreachable_admin(capsys: pytest.CaptureFixture[str]) -> None:
    assert purge(f"http://127.0.0.1:{free_port()}", "translate", None) == 2
    assert "cannot reach" in capsys.readouterr().err
