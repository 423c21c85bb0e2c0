"""Redis as the counter store, split by topology: `standalone.py` (standalone and Sentinel,
over the lean connection of `wire.py`), `cluster.py` (per slot, a breaker per master in
`node_breakers.py`), around what they share in `backend.py` (`RedisBackend`)."""

from rls.stores.redis.backend import RedisBackend, StoreRejected

__all__ = ["RedisBackend", "StoreRejected"]
