"""Admin `GET /top`: the descriptors over or near their limits right now, per domain.

Prometheus labels never carry request values, so "which caller is limited?" is answered here
from the limiter's bounded top-talkers sketch (rls/engine/top.py). Under `--workers` every
worker writes its snapshot once a second to `$RLS_SHARED_DIR/top-<pid>.json`; whichever worker
answers merges its own live snapshot with the others' files, so the counts are summed over all
workers. The answer names callers, so it sits behind the admin token when one is set.

Query: `domain` (one domain, default all), `sort` (`over` | `near`), `window` (`1m` | `5m`),
`limit` (rows per domain, 1..1000, default 20). With candidate limits configured, the answer
also has `candidates`: per domain, who each candidate would have limited (same rows, plus the
live limit's stats key and the candidate's name).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from rls.admin.auth import requires_token
from rls.engine.top import WINDOWS, TopTalkers, merge_candidates, merge_top
from rls.settings.environment import shared_dir

# A worker writes its file every second; one untouched for longer belongs to a dead worker
# (the supervisor restarts it under a new pid) and must not be counted twice.
STALE_SECONDS = 5.0
MAX_LIMIT = 1000


def other_workers(directory: str) -> list[dict[str, Any]]:
    """The fresh snapshot files of the other workers (blocking file reads: run off the loop)."""
    snapshots: list[dict[str, Any]] = []
    mine = f"top-{os.getpid()}.json"
    now = time.time()
    for path in Path(directory).glob("top-*.json"):
        if path.name == mine:
            continue
        try:
            if now - path.stat().st_mtime > STALE_SECONDS:
                continue
            snapshots.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # a worker replaced or removed its file meanwhile: next refresh sees it
    return snapshots


def _query(request: web.Request) -> tuple[str | None, str, str, int]:
    query = request.query
    domain = query.get("domain") or None
    sort = query.get("sort", "over")
    window = query.get("window", "1m")
    if sort not in ("over", "near"):
        raise ValueError("sort must be over or near")
    if window not in WINDOWS:
        raise ValueError(f"window must be one of {', '.join(WINDOWS)}")
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        raise ValueError("limit must be an integer") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_LIMIT}")
    return domain, sort, window, limit


@requires_token
async def top(request: web.Request) -> web.Response:
    try:
        domain, sort, window, limit = _query(request)
    except ValueError as exc:
        return web.json_response({"error": str(exc)}, status=400)
    own: TopTalkers = request.app["state"].service.limiter.top
    snapshots = [own.snapshot()]  # on the loop: the sketch is only touched there
    directory = shared_dir()
    if directory is not None:
        snapshots += await asyncio.to_thread(other_workers, directory)
    domains = merge_top(snapshots, window=window, sort=sort, domain=domain, limit=limit)
    body: dict[str, Any] = {
        "window": window, "sort": sort, "workers": len(snapshots), "domains": domains
    }
    candidates = merge_candidates(snapshots, window=window, sort=sort, domain=domain, limit=limit)
    if candidates:  # who candidate limits would have limited (only when some are configured)
        body["candidates"] = candidates
    return web.json_response(body)


def add_top_routes(app: web.Application) -> None:
    app.router.add_get("/top", top)
