"""envoyproxy/ratelimit's Redis settings, translated into a URL rls understands.

The reference takes `REDIS_URL` without a scheme and describes it with other variables:
`REDIS_SOCKET_TYPE` (unix, default, or tcp), `REDIS_TYPE` (single, sentinel, cluster),
`REDIS_AUTH` (`password` or `user:password`) and `REDIS_TLS`. Sentinel URLs are
`master,host:port,host:port`; cluster URLs `host:port,host:port`. An URL that already has a
scheme is used as it is.

`url_problem` checks a URL at start-up (scheme, host, port, db), so that a typo is refused with
the setting's name instead of connecting somewhere else or failing ten seconds later.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import parse_qs, quote, urlsplit

_SCHEME_WITHOUT_SLASHES = re.compile(r"^([a-z][a-z0-9+.-]*):/(?!/)", re.IGNORECASE)


def normalize_redis_url(url: str, env: Mapping[str, str]) -> str:
    """`url` with the scheme the reference's REDIS_* variables in `env` describe (read by
    rls.settings.environment, the one module that reads the environment)."""
    if not url or "://" in url:
        return url
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


def redact(url: str) -> str:
    """The URL without its password, for logs and error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return parts._replace(netloc=user + netloc).geturl()


def bare_url_problem(url: str) -> str | None:
    """A reference-style value (no `://`) that is really a URL with a typo: `redis:/host:6379`
    would otherwise be read as host `redis`."""
    found = _SCHEME_WITHOUT_SLASHES.match(url)
    if "://" in url or found is None or not found.group(1).lower().startswith(("redis", "unix")):
        return None
    scheme = found.group(1)
    rest = ("/" if scheme.lower() == "unix" else "") + url[found.end():].lstrip("/")
    return f"'{scheme}:' must be followed by '//': did you mean '{scheme}://{rest}'?"


def url_problem(url: str) -> str | None:
    """What is wrong with a store URL (redis://, rediss://, unix://, redis+sentinel://,
    redis+cluster://, ssdb://, memory://), or None. Only the form is checked, not whether
    anything answers there."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "memory":
        return None
    query = parse_qs(parts.query)
    db_text = query.get("db", [""])[-1]
    if db_text and not db_text.isdigit():
        return f"db {db_text!r} is not a number (?db=N)"
    if scheme == "unix":
        return None if parts.path else "unix:// needs a socket path: unix:///path/to/redis.sock"
    netloc = parts.netloc.rsplit("@", 1)[-1]
    hosts = netloc.split(",") if scheme.endswith(("+sentinel", "+cluster")) else [netloc]
    for item in hosts:
        problem = _host_port_problem(item)
        if problem is not None:
            return problem
    path = [p for p in parts.path.split("/") if p]
    if scheme.endswith("+sentinel"):
        if not path:
            return "a Sentinel URL needs the service name: redis+sentinel://host:port/service"
        path = path[1:]
    if len(path) > 1 or (path and not path[0].isdigit()):
        return f"db {parts.path.lstrip('/')!r} is not a number (…host:port/DB)"
    if scheme.endswith("+cluster") and path and int(path[0]) != 0:
        return "Redis Cluster has only db 0"
    return None


def _host_port_problem(item: str) -> str | None:
    """`host[:port]` or `[v6]:port`: a host, and a port 1-65535 when one is given."""
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else None if not rest else rest
    else:
        host, sep, port_text = item.rpartition(":")
        host, port = (host, port_text) if sep else (item, None)
    if not host:
        return f"no host in {item!r} (host:port)"
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        return f"port {port!r} is not a number 1-65535 (host:port)"
    return None
