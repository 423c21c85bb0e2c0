"""Usage statistics queries.

GET /usage?domain=d&day=YYYYMMDD&app=42[&interface=x]     -> {"calls": n}
GET /usage?domain=d&day=YYYYMMDD&distinct=user&app=42     -> {"distinct": n}
`day` defaults to today in the domain's usage time zone. The other query parameters are the
descriptor values, in the order of a configured `calls` (or `distinct.per`) key set.
"""

from __future__ import annotations

import time
from datetime import datetime

from aiohttp import web
from multidict import MultiMapping

from rls.core.usage import calls_key, day_of, distinct_key

RESERVED = {"domain", "day", "distinct"}


async def usage(request: web.Request) -> web.Response:
    state = request.app["state"]
    query = request.query
    config = state.config()
    domain = query.get("domain", "")
    dom = config.domains.get(domain) if config is not None else None
    if dom is None or dom.usage is None:
        return web.json_response(
            {"error": f"domain '{domain}' has no usage_stats configured"}, status=404
        )
    stats = dom.usage
    problem = _query_problem(query)
    if problem is not None:
        return web.json_response({"error": problem}, status=400)
    day = query.get("day") or day_of(int(time.time() * 1000), stats.timezone)
    values = {k: v for k, v in query.items() if k not in RESERVED}
    prefix = state.service.settings.key_prefix
    backend = state.service.limiter.backend
    distinct = query.get("distinct")
    if distinct:
        for stat in stats.distinct:
            if stat.key == distinct and set(stat.per) == set(values):
                parts = [(k, values[k]) for k in stat.per]
                key = distinct_key(prefix, domain, day, distinct, parts, dom.key_hash)
                n = await backend.usage_value("h", key)
                return web.json_response(
                    {"domain": domain, "day": day, "distinct": n, "key": distinct, "per": values}
                )
        return web.json_response({"error": "no such distinct statistic"}, status=404)
    for keys in stats.calls:
        if set(keys) == set(values):
            parts = [(k, values[k]) for k in keys]
            key = calls_key(prefix, domain, day, parts, dom.key_hash)
            n = await backend.usage_value("c", key)
            return web.json_response({"domain": domain, "day": day, "calls": n, "by": values})
    configured = [",".join(k) for k in stats.calls]
    return web.json_response(
        {"error": f"no calls statistic for keys {sorted(values)}; configured: {configured}"},
        status=404,
    )


def _query_problem(query: MultiMapping[str]) -> str | None:
    """Why the query cannot be answered: a malformed day would answer 0 calls as if the day had
    had no traffic, and a repeated parameter would answer for one of its values silently."""
    for name in query:
        if len(query.getall(name)) > 1:
            return f"query parameter {name!r} is given more than once"
    day = query.get("day")
    if day:
        try:
            ok = len(day) == 8 and day.isdigit() and bool(datetime.strptime(day, "%Y%m%d"))
        except ValueError:
            ok = False
        if not ok:
            return f"day must be a date as YYYYMMDD, not {day!r}"
    return None


def add_usage_routes(app: web.Application) -> None:
    app.router.add_get("/usage", usage)
