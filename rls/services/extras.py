"""Optional response extras, each off by default (docs/configuration.md, "Settings"):

- `--response-headers`: `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` in
  `response_headers_to_add` (envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED, same choice
  of descriptor: the smallest remaining, overridden by any non-quota OVER_LIMIT one; the three
  names are settings, as the reference's LIMIT_*_HEADER variables), plus `RateLimit-Policy`
  (IETF draft: `<limit>;w=<window seconds>` per limited descriptor; rls's own, fixed name).
- `--json-body`: a JSON body for 429 answers (`raw_body`), naming the limit and when to retry.
- `--dynamic-metadata`: decision details as dynamic metadata for Envoy's access logs
  (`%DYNAMIC_METADATA(envoy.filters.http.ratelimit)%`): the reference's `domain`,
  `descriptors[].entries`, `hitsAddend`, and the config `metadata` of passed descriptors.
"""

from __future__ import annotations

import json
from typing import Any

from envoy.service.ratelimit.v3 import rls_pb2

from rls.engine.limiter import OVER_LIMIT, Decision, Status
from rls.settings import Settings


def decorate(
    response: rls_pb2.RateLimitResponse,
    decision: Decision,
    request: rls_pb2.RateLimitRequest,
    settings: Settings,
) -> None:
    if settings.response_headers:
        _headers(response, decision.statuses, settings)
    if settings.json_body and decision.overall == OVER_LIMIT:
        response.raw_body = _json_body(decision.statuses)
        # Only on OVER_LIMIT: headers added to an OK answer would land on the upstream response.
        response.response_headers_to_add.add(key="content-type", value="application/json")
    if settings.dynamic_metadata:
        response.dynamic_metadata.update(_metadata(request, decision))


def _chosen(statuses: list[Status]) -> Status | None:
    chosen = None
    for st in statuses:
        if st.limit is None:
            continue
        if chosen is None or st.remaining < chosen.remaining:
            chosen = st
    for st in statuses:
        if st.limit is not None and st.code == OVER_LIMIT and not st.limit.quota_mode:
            chosen = st  # last one wins, like the reference
    return chosen


def _headers(
    response: rls_pb2.RateLimitResponse, statuses: list[Status], settings: Settings
) -> None:
    chosen = _chosen(statuses)
    if chosen is None or chosen.limit is None:
        return
    add = response.response_headers_to_add.add
    add(key=settings.limit_header, value=str(chosen.limit.requests_per_unit))
    add(key=settings.remaining_header, value=str(chosen.remaining))
    add(key=settings.reset_header, value=str(chosen.reset_seconds or 0))
    policy = ", ".join(
        f"{st.limit.requests_per_unit};w={st.limit.window_seconds}"
        for st in statuses
        if st.limit is not None
    )
    add(key="RateLimit-Policy", value=policy)


def _json_body(statuses: list[Status]) -> bytes:
    over = [st for st in statuses if st.code == OVER_LIMIT and st.limit is not None]
    retry = max((st.reset_seconds or 0 for st in over), default=0)
    body: dict[str, Any] = {
        "code": 429,
        "message": "rate limit exceeded",
        "retry_after_seconds": max(1, retry),
        "limits": [
            {
                "name": st.limit.name or st.limit.full_key,
                "requests_per_unit": st.limit.requests_per_unit,
                "window_seconds": st.limit.window_seconds,
            }
            for st in over
            if st.limit is not None
        ],
    }
    return json.dumps(body, separators=(",", ":")).encode()


def _metadata(request: rls_pb2.RateLimitRequest, decision: Decision) -> dict[str, Any]:
    descriptors = []
    merged: dict[str, Any] = {}
    for desc, st in zip(request.descriptors, decision.statuses, strict=False):
        item: dict[str, Any] = {"entries": [f"{e.key}={e.value}" for e in desc.entries]}
        if desc.HasField("hits_addend"):
            item["hitsAddend"] = desc.hits_addend.value
        item["code"] = "OVER_LIMIT" if st.code == OVER_LIMIT else "OK"
        if st.limit is not None:
            item["limit"] = st.limit.name or st.limit.full_key
            item["remaining"] = st.remaining
        descriptors.append(item)
    out: dict[str, Any] = {"domain": request.domain, "descriptors": descriptors}
    if request.hits_addend:
        out["hitsAddend"] = request.hits_addend
    out["overallCode"] = "OVER_LIMIT" if decision.overall == OVER_LIMIT else "OK"
    for meta in decision.metadata:
        _merge(merged, meta)
    if merged:
        out["metadata"] = merged
    return out


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    """Nested maps merge recursively; for conflicting scalars the first wins (reference)."""
    for key, value in extra.items():
        if key not in into:
            into[key] = value
        elif isinstance(into[key], dict) and isinstance(value, dict):
            _merge(into[key], value)
