"""Runtime settings: CLI flags, each also readable from `RLS_<NAME>` (and some reference names).

Precedence: flag > RLS_* env > envoyproxy/ratelimit env equivalent > default.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field

# envoyproxy/ratelimit environment names honoured when the RLS_* one is unset.
REFERENCE_ENV = {
    "redis_url": "REDIS_URL",
    "shadow_mode": "SHADOW_MODE",
    "quota_mode": "QUOTA_MODE",
    "merge_domains": "MERGE_DOMAIN_CONFIG",
    "near_limit_ratio": "NEAR_LIMIT_RATIO",
    "key_prefix": "CACHE_KEY_PREFIX",
    "log_level": "LOG_LEVEL",
    "log_format": "LOG_FORMAT",
    "response_headers": "LIMIT_RESPONSE_HEADERS_ENABLED",
    "dynamic_metadata": "RESPONSE_DYNAMIC_METADATA",
}


@dataclass(slots=True)
class Settings:
    config: list[str] = field(default_factory=list)
    grpc_addr: str = "0.0.0.0:8081"
    http_addr: str = "127.0.0.1:8080"
    redis_url: str = ""
    cache_config: str = ""
    cache_store: str = ""  # redis://, ssdb://…; default: the rules file's `store:`
    workers: int = 1
    failure_mode: str = "allow"  # allow | deny when the backend cannot answer in time
    backend_timeout_ms: int = 15
    # Share of each limit a process may grant on its own while the backend is away (0 = off,
    # the failure mode answers instead). With N replicas, 1/N keeps the total near the limit.
    fallback_share: float = 0.0
    # Answer keys known to be over limit locally until their reset (Redis only; 0 round trips).
    local_cache: bool = True
    auto_pipeline: bool = True  # concurrent Redis calls of a worker share one round trip
    breaker_threshold: int = 3  # consecutive backend failures that open the circuit
    breaker_cooldown_ms: int = 1000  # open circuit: time before one probe call
    log_format: str = "text"
    log_level: str = "info"
    shadow_mode: bool = False  # global: OVER_LIMIT answered as OK (reference SHADOW_MODE)
    quota_mode: bool = False  # every descriptor is a quota (reference QUOTA_MODE)
    limiting_off: bool = False  # degradation switch: always OK, metrics still recorded
    shadow_domains: set[str] = field(default_factory=set)  # per-domain shadow switch
    merge_domains: bool = False
    near_limit_ratio: float = 0.8
    key_prefix: str = "rl:"
    reload_interval: float = 1.0
    shutdown_delay_ms: int = 1000  # after SIGTERM: keep serving (readiness 503) this long
    drain_seconds: float = 5.0  # then: stop accepting, wait at most this for in-flight calls
    max_descriptors: int = 64
    max_entries: int = 32
    max_value_bytes: int = 1024
    max_request_bytes: int = 64 * 1024
    response_headers: bool = False  # RateLimit-* headers in response_headers_to_add
    json_body: bool = False  # JSON body (raw_body) on OVER_LIMIT answers
    dynamic_metadata: bool = False  # decision details as dynamic metadata for access logs
    # Admin listener off loopback without RLS_ADMIN_TOKEN: refused unless this is set.
    admin_insecure: bool = False
    grpc_token: str = ""  # when set, gRPC calls need metadata `authorization: Bearer <token>`

    def validate(self) -> None:
        if self.failure_mode not in ("allow", "deny"):
            raise ValueError(f"failure_mode must be allow or deny, not {self.failure_mode!r}")
        if len(self.key_prefix.encode()) > 32:
            raise ValueError("key_prefix must be at most 32 bytes")
        if self.workers < 1:
            raise ValueError("workers must be at least 1")
        if not (self.admin_insecure or os.environ.get("RLS_ADMIN_TOKEN")):
            if not is_loopback(self.http_addr):
                raise ValueError(
                    f"admin listener {self.http_addr} is not on loopback and RLS_ADMIN_TOKEN "
                    "is not set: set a token, bind --http-addr 127.0.0.1:PORT, "
                    "or pass --admin-insecure"
                )
        from rls.backends.urls import normalize_redis_url

        self.redis_url = normalize_redis_url(self.redis_url)


def is_loopback(addr: str) -> bool:
    """Whether a `host:port` listen address is reachable from this host only."""
    host = addr.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # empty (all interfaces) or a host name: assume reachable
        return False


def env_value(name: str, environ: dict[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    value = env.get(f"RLS_{name.upper()}")
    if value is None and name in REFERENCE_ENV:
        value = env.get(REFERENCE_ENV[name])
    return value


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")
