"""Counter stores behind one interface: embedded memory (default) and Redis."""

from __future__ import annotations

from rls.stores.base import Backend, BackendError
from rls.stores.memory import MemoryBackend
from rls.stores.redis import RedisBackend

__all__ = ["Backend", "BackendError", "MemoryBackend", "create_backend"]


def create_backend(redis_url: str | None, **options: object) -> Backend:
    """The embedded memory store when no URL is given, else Redis (any supported scheme)."""
    if not redis_url:
        return MemoryBackend()
    return RedisBackend(redis_url, **options)  # type: ignore[arg-type]
