"""What a Redis error says about the store: one mapping for the rate-limit store and the
frequency counters (and the response cache's Redis store), given to their `StoreGuard`."""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from rls.stores.guard import Breaker

# redis-py can surface a connection torn down mid-call (e.g. cut by a deadline) as a plain
# Python error; it is still the store failing, not a bad request.
CLIENT_GLITCHES = (AttributeError, TypeError, ValueError, IndexError, RuntimeError)


def judge(exc: Exception, breaker: Breaker) -> str | None:
    """The message for the store error `exc` stands for, `breaker` told: a connection-level
    error is evidence (`failure`), an odd answer or redis-py's socket timeout a suspicion (the
    probe decides), our own full pool neither. None: not a store error."""
    if isinstance(exc, RedisTimeoutError):
        breaker.suspect()
        return str(exc)
    if isinstance(exc, MaxConnectionsError):
        return str(exc)  # our own pool: no news of the store
    if isinstance(exc, (RedisConnectionError, OSError)):
        breaker.failure(str(exc))  # refused, reset, auth lost
        return str(exc)
    if isinstance(exc, RedisError):
        breaker.suspect()  # an error reply (OOM, READONLY…): the store answers, but ask
        return str(exc)
    if isinstance(exc, CLIENT_GLITCHES):
        breaker.suspect()
        return f"client error: {exc!r}"
    return None
