"""Counter stores behind one interface: embedded memory (default) and Redis."""

from __future__ import annotations

from rls.stores.base import Backend, BackendError, StoreDown
from rls.stores.breaker import CircuitBreaker
from rls.stores.memory import MemoryBackend
from rls.stores.redis import RedisBackend
from rls.stores.redis.connect import NO_TLS_CLIENT, TlsClient

__all__ = ["Backend", "BackendError", "MemoryBackend", "StoreDown", "create_backend"]


def create_backend(
    redis_url: str | None,
    *,
    timeout_ms: int = 50,
    connect_timeout_ms: int = 200,
    pool_size: int = 64,
    breaker: CircuitBreaker | None = None,
    auto_pipeline: bool = True,
    probe_timeout_ms: int = 200,
    tls: TlsClient = NO_TLS_CLIENT,
) -> Backend:
    """The embedded memory store when no URL is given, else Redis (any supported scheme)."""
    if not redis_url:
        return MemoryBackend()
    return RedisBackend(
        redis_url, timeout_ms=timeout_ms, connect_timeout_ms=connect_timeout_ms,
        pool_size=pool_size,
        breaker=breaker,
        auto_pipeline=auto_pipeline, probe_timeout_ms=probe_timeout_ms, tls=tls,
    )
