"""The rules every decision path shares: which matched limits apply, when an over-limit answer
is only observed (shadow), and what a store failure answers.

ShouldRateLimit (rls.engine.limiter), quota mode (rls.quota.table, rls.quota.respond) and
replay (rls.replay.engines) each call these, so a rule changed here changes all three at once.
Pure functions over config values and settings, no I/O.
"""

from __future__ import annotations

from collections.abc import Container

from rls.config.model import Domain, Limit
from rls.settings import Settings

# What a matched limit is to the request (`limit_role`).
REPLACED = 0  # another limit the request matched names it in `replaces`: as if not configured
UNLIMITED = 1  # `unlimited: true`: answered without a counter (remaining 2^32-1)
COUNTED = 2  # charged and checked against its counter


def limit_role(limit: Limit, replaced: Container[str]) -> int:
    """REPLACED, UNLIMITED or COUNTED: what `limit` is to a request whose matched limits name
    `replaced` in their `replaces` (every descriptor of the request; for a quota bucket, its
    one descriptor). A replaced limit is dropped even when unlimited: it reports nothing."""
    if limit.name and limit.name in replaced:
        return REPLACED
    if limit.unlimited:
        return UNLIMITED
    return COUNTED


def domain_shadowed(settings: Settings, domain: str) -> bool:
    """Whether an over-limit verdict in `domain` is only observed, not enforced: global
    shadow mode, limiting switched off, or the domain listed as shadowed."""
    return settings.shadow_mode or settings.limiting_off or domain in settings.shadow_domains


def failure_mode(settings: Settings, dom: Domain | None) -> str:
    """What answers a request the store could not decide: the domain's failure mode, else the
    global one (allow, deny or error); with limiting switched off, always allow."""
    if settings.limiting_off:
        return "allow"
    return (dom.failure_mode if dom is not None else None) or settings.failure_mode
