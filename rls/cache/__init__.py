"""Response cache for idempotent APIs, served to Envoy through ext_proc (DESIGN §7).

`build_cache(path, store_url, registry)` returns the gRPC servicer and the cache; the cache is
what the admin routes (`rls.admin.cache.add_cache_routes`) and shutdown (`await cache.close()`)
need. Rule files are validated by `load_cache_config` / `check_cache_file`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from rls.cache.cache import ResponseCache
from rls.cache.config import CacheConfig, check_cache_file, is_cache_file, load_cache_config
from rls.cache.metrics import CacheMetrics
from rls.cache.store import create_store

if TYPE_CHECKING:
    from rls.services.extproc import ExtProcService

__all__ = [
    "CacheConfig",
    "ResponseCache",
    "build_cache",
    "check_cache_file",
    "is_cache_file",
    "load_cache_config",
]

log = logging.getLogger("rls.cache")


def build_cache(
    cache_config_path: str,
    store_url: str | None = None,
    registry: CollectorRegistry | None = None,
    *,
    config: CacheConfig | None = None,
) -> tuple[ExtProcService, ResponseCache]:
    """Servicer and cache from a rules file (raises ConfigError) and a store URL.

    The store is `store_url` if given, else the file's `store:`, else in-process memory (one
    process only, an LRU within `memory_max_bytes`: fine for a demo, not for several replicas or
    workers). Connecting is lazy:
    a store that is down at start only means uncached requests until it answers.
    """
    from rls.services.extproc import ExtProcService

    if config is None:
        config = load_cache_config(cache_config_path)
    url = store_url or config.store
    if not url:
        log.warning("no cache store URL given: entries live in this process's memory only")
    store = create_store(
        url, timeout_ms=config.store_timeout_ms, memory_max_bytes=config.memory_max_bytes
    )
    cache = ResponseCache(config, store, CacheMetrics(registry))
    return ExtProcService(cache), cache
