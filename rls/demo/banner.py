"""What the interactive demo prints once it is up: where everything runs and curl commands
to try, with the Envoy config's API keys and this run's ports filled in.

The `ports:` line is read by tests/deploy/test_demo.py; keep its shape. That test also runs every
command under `Try:` as printed (comment lines start with `#`, a trailing backslash continues a
command), so each must work when pasted into a shell.
"""

from __future__ import annotations

import json

from rls.demo.descriptors import QUOTA_LIMIT
from rls.demo.processes import Demo


def banner(demo: Demo) -> str:
    """Rate-limit mode (plus the response-cache commands with --cache)."""
    gw = f"http://127.0.0.1:{demo.listener}"
    alice, bob = demo.key("alice"), demo.key("bob")
    keys = ", ".join(f"{client}={key}" for client, key in demo.keys.items()) or "none"
    counters = json.dumps({"domain": "gateway", "descriptors": [{"entries": [
        {"key": "api", "value": "items"}, {"key": "user", "value": "alice"}]}]})
    cache_lines = "" if not demo.cache else (
        "  # response cache: the same page twice, x-cache MISS then HIT\n"
        f"  for i in 1 2; do curl -si -H 'x-api-key: {bob}' '{gw}/items?page=7' "
        "| grep -i '^x-cache'; done\n"
        f"  curl -s -X POST -H 'content-type: application/json' -d '{{}}' "
        f"'{demo.admin_url}/cache/purge?api=items'\n"
        "  # translation keyed on the JSON members api, extraKey, payload (id is not part of\n"
        "  # the key: MISS then HIT) and charged 5 (the payload's length) only on the MISS\n"
        "  for i in 1 2; do curl -si -H 'x-api-key: " + bob + "' -d '{\"api\": \"en2fr\", "
        "\"extraKey\": \"t1\", \"payload\": \"hello\", \"id\": '$i'}' "
        f"{gw}/translate | grep -i '^x-cache'; done\n"
    )
    return f"""
rls demo is running (logs in {demo.workdir})
  Envoy gateway  {gw}          API keys: {keys}
  rls            gRPC 127.0.0.1:{demo.grpc}, admin {demo.admin_url} (memory backend)
  backend        {', '.join(f'127.0.0.1:{p}' for p in demo.backends)}
  Envoy admin    http://127.0.0.1:{demo.envoy_admin}
ports: listener={demo.listener} envoy_admin={demo.envoy_admin} grpc={demo.grpc} \
http={demo.http} backend={','.join(map(str, demo.backends))}

Try:
  # no API key: 401
  curl -i {gw}/items
  # 200 with x-ratelimit-* headers (alice's key; Envoy forwards x-client-id: alice)
  curl -i -H 'x-api-key: {alice}' {gw}/items
  # 30 calls per user per minute on /items, then 429
  for i in $(seq 32); do curl -s -o /dev/null -w '%{{http_code}} ' \\
      -H 'x-api-key: {alice}' {gw}/items; done; echo
  # machine translation costs the body size: 5000 of bob's 100000 per minute
  head -c 5000 /dev/zero | tr '\\0' x | curl -s --data-binary @- \\
      -H 'x-api-key: {bob}' {gw}/translate
  # rls counters without charging (CLI and admin API)
  rls counters --admin {demo.admin_url} --domain gateway -d api=translate,user=bob
  curl -s -X POST -H 'content-type: application/json' {demo.admin_url}/counters \\
      -d '{counters}'
  curl -s {demo.admin_url}/rlconfig
  curl -s {demo.admin_url}/metrics | grep '^rls_limit'
  curl -s 'http://127.0.0.1:{demo.envoy_admin}/stats?filter=ratelimit'
{cache_lines}
Press Ctrl-C to stop.
"""


def quota_banner(demo: Demo) -> str:
    """Quota mode: Envoy decides from rls's assignments."""
    gw = f"http://127.0.0.1:{demo.listener}"
    counters = json.dumps({"domain": "gateway-rlqs", "descriptors": [
        {"entries": [{"key": "x-client-id", "value": "alice"}]}]})
    return f"""
rls demo (quota mode) is running (logs in {demo.workdir})
  Envoy gateway  {gw}   rate_limit_quota filter, domain gateway-rlqs
  rls            gRPC 127.0.0.1:{demo.grpc} (RLQS stream), admin {demo.admin_url}
  backend        {', '.join(f'127.0.0.1:{p}' for p in demo.backends)}
  Envoy admin    http://127.0.0.1:{demo.envoy_admin}

Envoy decides every request itself from rls's assignments; rls sees usage every 5 s.
Try:
  # {QUOTA_LIMIT} per minute per x-client-id, then 429 (x-ratelimit-quota: denied)
  for i in $(seq 12); do curl -s -o /dev/null -w '%{{http_code}} ' \\
      -H 'x-client-id: alice' {gw}/items; done; echo
  # the limit's counter (the one ShouldRateLimit uses): its `used` is what Envoy was
  # granted, charged when rls hands it out (unused tokens come back at the next report,
  # every 5 s), not the requests sent: it runs ahead of them, up to the whole {QUOTA_LIMIT}
  # for a client granted its full room at a window's start without sending anything
  curl -s -X POST -H 'content-type: application/json' {demo.admin_url}/counters \\
      -d '{counters}'
  curl -s {demo.admin_url}/metrics | grep '^rls_quota'

Press Ctrl-C to stop.
"""
