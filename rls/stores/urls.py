"""envoyproxy/ratelimit's Redis settings, translated into a URL rls understands.

The reference takes `REDIS_URL` without a scheme and describes it with other variables:
`REDIS_SOCKET_TYPE` (unix, default, or tcp), `REDIS_TYPE` (single, sentinel, cluster),
`REDIS_AUTH` (`password` or `user:password`) and `REDIS_TLS`. Sentinel URLs are
`master,host:port,host:port`; cluster URLs `host:port,host:port`. An URL that already has a
scheme is used as it is.
"""

from __future__ import annotations

import os
from urllib.parse import quote


def normalize_redis_url(url: str, environ: dict[str, str] | None = None) -> str:
    if not url or "://" in url:
        return url
    env = os.environ if environ is None else environ
    socket_type = env.get("REDIS_SOCKET_TYPE", "unix" if url.startswith("/") else "tcp").lower()
    redis_type = env.get("REDIS_TYPE", "single").lower()
    tls = env.get("REDIS_TLS", "false").lower() in ("1", "true", "yes")
    auth = env.get("REDIS_AUTH", "")
    userinfo = ""
    if auth:
        user, sep, password = auth.partition(":")
        userinfo = (
            f"{quote(user, safe='')}:{quote(password, safe='')}@"
            if sep
            else f":{quote(auth, safe='')}@"
        )
    scheme = "rediss" if tls else "redis"
    if redis_type == "sentinel":
        master, _, hosts = url.partition(",")
        if not hosts:
            raise ValueError(
                "REDIS_TYPE=sentinel expects REDIS_URL 'master,host:port[,host:port…]'"
            )
        return f"{scheme}+sentinel://{userinfo}{hosts}/{master}"
    if redis_type == "cluster":
        return f"{scheme}+cluster://{userinfo}{url}"
    if redis_type != "single":
        raise ValueError(f"unrecognized REDIS_TYPE {redis_type!r}: single, sentinel or cluster")
    if socket_type == "unix":
        return f"unix://{userinfo}{url}"
    return f"{scheme}://{userinfo}{url}"
