"""Counter stores behind one interface: embedded memory (default) and Redis."""

from __future__ import annotations

from typing import Unpack

from rls.stores.base import Backend, BackendError, StoreDown
from rls.stores.memory import MemoryBackend
from rls.stores.redis import RedisBackend
from rls.stores.redis.backend import RedisOptions

__all__ = ["Backend", "BackendError", "MemoryBackend", "StoreDown", "create_backend"]


def create_backend(redis_url: str | None, **options: Unpack[RedisOptions]) -> Backend:
    """The embedded memory store when no URL is given, else Redis (any supported scheme)."""
    if not redis_url:
        return MemoryBackend()
    return RedisBackend(redis_url, **options)
