"""OpenTelemetry tracing (docs/observability.md#tracing): on with `--tracing-enabled`.

This module stays light: `start_tracing` imports OpenTelemetry (`rls.tracing.wiring`) only when
tracing is on, so an rls without tracing never loads it and its handlers stay the plain ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from rls.engine.limiter import RateLimiter
    from rls.settings import Settings
    from rls.tracing.wiring import Tracing


def start_tracing(
    settings: Settings, registry: CollectorRegistry, limiter: RateLimiter
) -> Tracing | None:
    """The process's tracing (its store-call span already on `limiter`), or None when off."""
    if not settings.tracing_enabled:
        return None
    from rls.tracing.wiring import Tracing

    return Tracing(settings, registry, limiter)


def startup_problem(settings: Settings) -> str | None:
    """Why tracing cannot start (one line naming the OTEL_* variable), None when it can or is
    off; `rls serve` exits 2 with it before anything is set up."""
    if not settings.tracing_enabled:
        return None
    from rls.tracing.wiring import setup_problem

    return setup_problem(settings)
