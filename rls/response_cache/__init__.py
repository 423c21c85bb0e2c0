"""Response cache for idempotent APIs, served to Envoy through ext_proc.

The cache policy, keys, entries and stores live here; the gRPC servicer that serves them to
Envoy is `rls.services.extproc` (whose `build_cache(path, store_url, registry)` returns both).
Rule files are validated by `load_cache_config` / `check_cache_file`.
"""

from __future__ import annotations

from rls.response_cache.cache import ResponseCache
from rls.response_cache.config import (
    CacheConfig,
    check_cache_file,
    is_cache_file,
    load_cache_config,
)

__all__ = [
    "CacheConfig",
    "ResponseCache",
    "check_cache_file",
    "is_cache_file",
    "load_cache_config",
]
