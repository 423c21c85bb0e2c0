"""Redis URLs into redis-py clients: the one connector of rls.

It stands apart from the rate-limit store (`rls/stores/redis/`) because three parts connect
through it: the rate-limit store (and the counters service, which runs on that store's client)
and the response cache's Redis store. Keeping it in one place means each gets standalone, TLS,
Sentinel and Cluster alike, with the same timeouts and pool rules. URLs:
- `redis://[[user]:password@]host:port/db`, `rediss://…` (TLS), `unix:///path?db=N`;
- `redis+sentinel://[[user]:password@]host:port[,host:port…]/service_name[/db]`;
- `redis+cluster://[[user]:password@]host:port[,host:port…]`.

`refusal` turns the store refusing us (wrong or missing password, ACL) into one line naming
the setting to fix.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

import redis
import redis.asyncio as aioredis
import redis.cluster
import redis.sentinel
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

from rls.stores.redis.urls import redact

__all__ = ["TlsClient", "connect", "redact", "refusal"]

STANDALONE_SCHEMES = ("redis", "rediss", "unix")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
TLS_QUERY = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname")


@dataclass(frozen=True, slots=True)
class TlsClient:
    """TLS settings of rediss:// connections from the environment (the reference's
    `REDIS_TLS_CLIENT_CERT`, `REDIS_TLS_CLIENT_KEY`, `REDIS_TLS_CACERT`,
    `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`): a client certificate for a Redis that requires
    one, the CA that signed the server's. A URL's own `?ssl_…` query wins over them."""

    certfile: str = ""
    keyfile: str = ""
    ca_certs: str = ""
    skip_hostname_verification: bool = False

    def options(self) -> dict[str, Any]:
        """redis-py's SSL keywords for the settings that are set."""
        tls: dict[str, Any] = {}
        if self.certfile:
            tls["ssl_certfile"] = self.certfile
        if self.keyfile:
            tls["ssl_keyfile"] = self.keyfile
        if self.ca_certs:
            tls["ssl_ca_certs"] = self.ca_certs
        if self.skip_hostname_verification:
            tls["ssl_check_hostname"] = False
        return tls


NO_TLS_CLIENT = TlsClient()


def _hosts(netloc: str) -> list[tuple[str, int]]:
    hosts = []
    for item in netloc.rsplit("@", 1)[-1].split(","):
        host, _, port = item.rpartition(":")
        hosts.append((host.strip("[]") or "127.0.0.1", int(port or 6379)))
    return hosts


def _tls_options(secure: bool, query: dict[str, str], client: TlsClient) -> dict[str, Any]:
    """TLS settings for the Sentinel and Cluster clients: `client`'s, then the URL query's
    (`rediss://` reads its query itself): `?ssl_ca_certs=/ca.pem&ssl_cert_reqs=none…`."""
    if not secure:
        return {}
    tls: dict[str, Any] = {"ssl": True, **client.options()}
    for name in TLS_QUERY:
        if name in query:
            tls[name] = query[name]
    reqs = tls.get("ssl_cert_reqs")
    if reqs is not None:
        tls["ssl_cert_reqs"] = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL}.get(
            reqs, ssl.CERT_REQUIRED
        )
    if "ssl_check_hostname" in tls:
        tls["ssl_check_hostname"] = tls["ssl_check_hostname"].lower() in ("1", "true", "yes")
    return tls


def _auth(parts: SplitResult) -> dict[str, Any]:
    """The URL's user and password, unquoted, as client keywords (None when absent)."""
    return {
        "username": unquote(parts.username) if parts.username else None,
        "password": unquote(parts.password) if parts.password else None,
    }


def _retry(retry: Any) -> dict[str, Any]:
    """The `retry` keyword only when one is given, so redis-py keeps its own default."""
    return {"retry": retry} if retry is not None else {}


def connect(
    url: str,
    timeout_s: float,
    connect_timeout_s: float,
    pool_size: int,
    sync: bool = False,
    pool_timeout_s: float | None = None,
    retry: Any = None,
    tls: TlsClient = NO_TLS_CLIENT,
) -> Any:
    """A redis-py client for any supported URL scheme: asyncio, or blocking with `sync` (the
    health probe's own connection, used from a thread). The one connector of rls: counters,
    the response cache and the counters service all connect through it, so each gets
    standalone, TLS, Sentinel and Cluster alike.

    `pool_timeout_s`: how long a call waits for a free pooled connection (default: the larger
    of 1 s and the socket timeout); `retry`: redis-py Retry for connection errors (standalone
    and Sentinel; Cluster has its own retries); `tls`: client certificate and CA of rediss://
    URLs (any topology)."""
    common: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": connect_timeout_s,
    }
    parts = urlsplit(url)
    scheme = parts.scheme
    if scheme in STANDALONE_SCHEMES:
        timeout = pool_timeout_s if pool_timeout_s is not None else max(1.0, timeout_s)
        secure = tls.options() if scheme == "rediss" else {}
        return _standalone(url, pool_size, timeout, retry, {**common, **secure}, sync)
    auth = _auth(parts)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    options = _tls_options(scheme.startswith("rediss"), query, tls)
    if scheme in SENTINEL_SCHEMES:
        return _sentinel(parts, pool_size, retry, auth, common, options, sync)
    if scheme in CLUSTER_SCHEMES:
        return _cluster(parts, pool_size, auth, common, options, sync)
    raise ValueError(f"unsupported Redis URL scheme {scheme!r}")


def _standalone(
    url: str,
    pool_size: int,
    pool_timeout_s: float,
    retry: Any,
    common: dict[str, Any],
    sync: bool,
) -> Any:
    """`redis://`, `rediss://` (redis-py reads the TLS query itself) and `unix://`."""
    pool_class: Any = redis.BlockingConnectionPool if sync else aioredis.BlockingConnectionPool
    client_class: Any = redis.Redis if sync else aioredis.Redis
    # A blocking pool waits (up to the call's deadline) for a free connection; the default
    # pool raises "Too many connections" at once when more calls are in flight than
    # connections.
    pool = pool_class.from_url(
        url,
        max_connections=pool_size,
        timeout=pool_timeout_s,
        retry_on_timeout=False,
        **_retry(retry),
        **common,
    )
    return client_class(connection_pool=pool)


def _sentinel(
    parts: SplitResult,
    pool_size: int,
    retry: Any,
    auth: dict[str, Any],
    common: dict[str, Any],
    tls: dict[str, Any],
    sync: bool,
) -> Any:
    """`redis+sentinel://hosts/service_name[/db]`: the master's client, found via Sentinel."""
    sentinel_class: Any = redis.sentinel.Sentinel if sync else Sentinel
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise ValueError("redis+sentinel:// URL needs a service name: …/service_name[/db]")
    service, db = path[0], int(path[1]) if len(path) > 1 else 0
    sentinel = sentinel_class(
        _hosts(parts.netloc),
        sentinel_kwargs={**common, **tls},
        retry_on_timeout=False,
        **common,
        **tls,
    )
    return sentinel.master_for(
        service, db=db, max_connections=pool_size, **_retry(retry), **auth, **common, **tls
    )


def _cluster(
    parts: SplitResult,
    pool_size: int,
    auth: dict[str, Any],
    common: dict[str, Any],
    tls: dict[str, Any],
    sync: bool,
) -> Any:
    """`redis+cluster://host:port[,host:port…]`: a cluster client seeded with those nodes."""
    cluster_class: Any = redis.cluster.RedisCluster if sync else RedisCluster
    node_class: Any = redis.cluster.ClusterNode if sync else ClusterNode
    # RedisCluster takes no retry_on_timeout. The asyncio client (the store's calls) makes one
    # attempt per call: its retries read the whole slot map again before each (CLUSTER SLOTS,
    # 16384 slots rebuilt, COMMAND parsed), up to four times per failing call, CPU that a
    # failover's burst of failing calls took from every other caller. A failing
    # call is evidence for its master's breaker instead, and the map is read again by the next
    # call or, while a master's breaker is open, by `node_breakers.py` (once per interval).
    nodes = [node_class(h, p) for h, p in _hosts(parts.netloc)]
    once = {} if sync else {"retry": Retry(NoBackoff(), 0)}
    return cluster_class(
        startup_nodes=nodes, max_connections=pool_size, **once, **auth, **common, **tls
    )


# Where the rate-limit store's URL (and its password) is set; named in refusals.
REDIS_URL_SETTING = "--redis-url / RLS_REDIS_URL (or REDIS_AUTH with REDIS_URL)"
_REFUSED = ("NOPERM", "WRONGPASS", "NOAUTH")


def refusal(exc: Exception, setting: str = REDIS_URL_SETTING) -> str | None:
    """Why the store refuses us, in one line naming the setting to fix; None when `exc` is
    not a refusal (a timeout, a closed connection). Redis's own text says neither (its answer
    to a missing password is about HELLO's syntax)."""
    text = str(exc).strip()
    code = text.split(" ", 1)[0]
    coded = isinstance(exc, ResponseError) and code in _REFUSED
    if isinstance(exc, NoPermissionError) or (coded and code == "NOPERM"):
        return (
            f"the Redis user lacks a permission rls needs ({text}): grant it in the ACL, "
            f"or set another user in {setting}"
        )
    if not (isinstance(exc, AuthenticationError) or coded):
        return None
    if "HELLO must be called" in text or "Authentication required" in text or code == "NOAUTH":
        return (
            f"Redis needs a password and none was given: set it in {setting} "
            "as redis://[user]:PASSWORD@host:port/db"
        )
    return (
        f"Redis refuses the user or password ({text.rstrip('.')}): fix them in {setting}"
    )
