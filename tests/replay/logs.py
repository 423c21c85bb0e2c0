"""Traffic logs for the replay tests, in both formats rls replay reads."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from rls.engine.decision import DescriptorIn
from rls.engine.decision_log import line

# 2026-01-01T00:00:00Z: minute-aligned.
T0 = 1_767_225_600_000

Request = tuple[int, str, Sequence[DescriptorIn], int]  # (ts ms, domain, descriptors, hits)


def decision_log(path: Path, requests: Sequence[Request], code: str = "OK") -> Path:
    path.write_text("".join(line(ts, code, dom, descs, hits) + "\n"
                            for ts, dom, descs, hits in requests))
    return path


def envoy_line(ts: int, domain: str, descs: Sequence[DescriptorIn], hits: int,
               code: str = "OK") -> str:
    """An access log line as Envoy writes it with the format of docs/changing-limits.md: rls's
    dynamic metadata (`--dynamic-metadata`) under `ratelimit`, START_TIME in RFC 3339."""
    seconds, ms = divmod(ts, 1000)
    from datetime import UTC, datetime

    start = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    meta: dict[str, object] = {
        "domain": domain,
        "descriptors": [
            {"entries": [f"{k}={v}" for k, v in d.entries],
             **({"hitsAddend": float(d.hits)} if d.hits is not None else {}), "code": code}
            for d in descs
        ],
        "overallCode": code,
    }
    if hits:
        meta["hitsAddend"] = float(hits)
    return json.dumps({"start_time": f"{start}.{ms:03d}Z", "method": "GET", "path": "/x",
                       "response_code": 200, "ratelimit": meta})


def user(name: str, hits: int | None = None) -> DescriptorIn:
    return DescriptorIn((("user", name),), hits)
