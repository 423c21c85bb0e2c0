"""The values a decision is made of: what comes in, what goes out (no protobuf)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rls.config.model import Limit

OK = 1
OVER_LIMIT = 2
UNLIMITED_REMAINING = 4294967295


@dataclass(slots=True)
class DescriptorIn:
    entries: tuple[tuple[str, str], ...]
    hits: int | None = None  # the descriptor's own hits_addend, if set (0 allowed)
    negative: bool = False  # is_negative_hits: give hits back
    override: tuple[int, int, int] | None = None  # (requests_per_unit, unit, multiplier)


@dataclass(slots=True)
class Status:
    code: int = OK
    limit: Limit | None = None
    remaining: int = 0
    reset_ms: int | None = None

    @property
    def reset_seconds(self) -> int | None:
        return None if self.reset_ms is None else math.ceil(self.reset_ms / 1000)


@dataclass(slots=True)
class Decision:
    overall: int
    statuses: list[Status]
    # Config `metadata` of the descriptors that passed, in request order (for dynamic metadata).
    metadata: list[dict[str, Any]] = field(default_factory=list)


class Overloaded(RuntimeError):
    """This process could not decide in time through no fault of the store: the caller gets
    UNAVAILABLE so that Envoy's own failure mode decides, instead of a silent OK."""


class StoreFailed(RuntimeError):
    """The store could not decide and the failure mode is `error`: the caller gets UNAVAILABLE
    at once, so that its own failure mode decides (Envoy's failure_mode_deny, Envoy Gateway's
    failClosed), as with the reference, which returns an error when Redis fails."""


class NoConfigLoaded(RuntimeError):
    """No rate limit configuration is loaded: UNAVAILABLE (503 on the admin API)."""


class InvalidRequest(ValueError):
    """The request itself is wrong (INVALID_ARGUMENT); nothing was charged."""
