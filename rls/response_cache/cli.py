"""`rls cache purge --api NAME`: a thin client of the admin API (POST /cache/purge)."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.parse
import urllib.request


def purge(admin_url: str, api: str, token: str | None, timeout: float = 5.0) -> int:
    """Purge one API's entries; exit code 0 on success, 1 when refused, 2 when unreachable.

    Prints the admin API's JSON answer (stdout on success, stderr otherwise).
    """
    url = f"{admin_url.rstrip('/')}/cache/purge?{urllib.parse.urlencode({'api': api})}"
    request = urllib.request.Request(url, data=b"", method="POST")
    request.add_header("Content-Type", "application/json")  # the admin API takes only JSON
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            print(resp.read().decode(errors="replace").strip())
            return 0
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace").strip()
        try:
            message = json.loads(body).get("error", body)
        except (ValueError, AttributeError):
            message = body
        print(f"rls cache purge: HTTP {exc.code}: {message}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"rls cache purge: cannot reach {admin_url}: {exc}", file=sys.stderr)
        return 2
