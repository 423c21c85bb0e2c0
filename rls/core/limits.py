"""The limits model: units, windows and one configured limit (`Limit`).

Below the config (which builds Limits from YAML), the stores (which evaluate checks of them)
and the engine: the one place a limit's shape is defined.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from rls.core.algorithms.registry import ALGORITHM_NAMES, KEY_TAGS


class Unit(IntEnum):
    """Numbering of envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit."""

    UNKNOWN = 0
    SECOND = 1
    MINUTE = 2
    HOUR = 3
    DAY = 4
    MONTH = 5
    YEAR = 6
    WEEK = 7


# Window lengths of the reference service: MONTH is 30 days and YEAR 365 days, epoch aligned.
UNIT_SECONDS: dict[Unit, int] = {
    Unit.SECOND: 1,
    Unit.MINUTE: 60,
    Unit.HOUR: 3600,
    Unit.DAY: 86400,
    Unit.WEEK: 604800,
    Unit.MONTH: 2592000,
    Unit.YEAR: 31536000,
}

# Longest window a limit may have (unit x unit_multiplier): 100 years. Keeps every time value
# well inside exact float and int64 range on both backends.
MAX_WINDOW_SECONDS = 100 * 365 * 86400

ALGORITHMS: tuple[str, ...] = ALGORITHM_NAMES  # YAML names, from the registry

# `window:` of a fixed window (YAML; the counters API uses the same rolling name). Aligned
# windows share their bounds (epoch, or `calendar: true`); a rolling one starts at the key's
# first charge and lasts the window, so each key has its own bounds.
WINDOW_ALIGNED = "aligned"
WINDOW_ROLLING = "rolling_from_first_hit"
# `charge:` values (Limit.charge_always and Limit.costs_on_allow say what each means).
CHARGE_DEFAULT = "costs_always"
CHARGES = ("on_allow", CHARGE_DEFAULT, "always")
WINDOWS: tuple[str, ...] = (WINDOW_ALIGNED, WINDOW_ROLLING)
# Algorithms whose charge and release are exact inverses within a window and whose room does
# not refill inside it: what can be held by a reservation and given back later. Quota mode's
# dealing (rls.quota.share) and a limit's `reserve:` (docs/token-budgets.md) both rest on it.
RESERVABLE_ALGORITHMS = frozenset({"fixed_window"})
# `reserve:` bounds: how long an unsettled reservation is kept (docs/token-budgets.md).
RESERVE_EXPIRY_DEFAULT_S = 600
RESERVE_EXPIRY_MAX_S = 86400


@dataclass(slots=True, frozen=True)
class Reserve:
    """A limit's `reserve:` (docs/token-budgets.md): charge an estimate when the request comes,
    settle it against the actual cost when the stream ends.

    `estimate`: hits charged at request time (0: the request-time call's own hits_addend).
    `id_key` / `settle_key`: descriptor entry keys taken out of the descriptor before it is
    matched (never part of a counter key): the first carries the request id that ties the two
    calls, the second is present only on the stream-done call (that call is the settle).
    `expire_ms`: how long a reservation waits for its settle; past it the estimate stays
    charged."""

    id_key: str
    settle_key: str
    estimate: int = 0
    expire_ms: int = RESERVE_EXPIRY_DEFAULT_S * 1000


@dataclass(slots=True, eq=False, frozen=True)
class Limit:
    """One rate limit as configured on a descriptor node (or built from a request override).

    `ident` is the stable part of the counter key that says which limit this is (algorithm and
    window, calendar or rolling included); changing any of them starts a fresh counter instead
    of misreading old state (an aligned value read as a rolling one would keep its old start).
    """

    requests_per_unit: int
    unit: Unit
    name: str = ""
    unlimited: bool = False
    shadow_mode: bool = False
    quota_mode: bool = False
    replaces: frozenset[str] = frozenset()
    algorithm: str = "fixed_window"
    unit_multiplier: int = 1
    burst: int | None = None
    overdraft: int = 0
    calendar: bool = False
    # `window: rolling_from_first_hit` (fixed_window only): the key's window starts at its first
    # charge, not at an epoch or calendar boundary.
    rolling: bool = False
    timezone: str = "UTC"
    # When hits are recorded (YAML `charge`). Unset (`costs_always`): plain hits only when the
    # whole request is admitted, an explicit cost (Envoy's per-descriptor hits_addend > 0)
    # whatever the decision, since Envoy sends costs known after the response (its
    # apply_on_stream_done call, whose answer it ignores) exactly like request-time ones.
    # `on_allow`: every hit only when admitted. `always`: every hit whatever the decision.
    charge_always: bool = False
    costs_on_allow: bool = False
    # Whether is_negative_hits may give hits back (YAML `accept_releases`); None = only for
    # `concurrency`, whose leases are released that way. Elsewhere a release is ignored: any
    # caller could otherwise zero any counter with one huge negative addend.
    accept_releases: bool | None = None
    # Config path for metrics, e.g. "domain.key1_value1.subkey1" (reference stats key).
    full_key: str = ""
    index: int = 0
    ident: str = ""
    window_ms: int = 0
    # Derived: an epoch-aligned fixed window (no overdraft, not rolling, not calendar), the
    # plain counter the stores decide on their shortest path.
    plain: bool = False
    # Candidate limits counted beside this one (YAML `candidates:`), never enforced; and, on a
    # candidate itself, its name (its counter key is the live key + its ident, `~<name>~...`).
    candidates: tuple[Limit, ...] = ()
    candidate: str = ""
    # `reserve:` (Reserve): estimate at request time, settle at stream end; None: plain.
    reserve: Reserve | None = None

    @property
    def charge(self) -> str:
        """The YAML `charge:` value this limit was declared with (one of CHARGES)."""
        if self.charge_always:
            return "always"
        return "on_allow" if self.costs_on_allow else CHARGE_DEFAULT

    def __post_init__(self) -> None:
        # Frozen: the derived fields are set once here (object.__setattr__), never after.
        # Runtime state (metric handles, memos) lives with its owner, not on the config.
        derived = object.__setattr__
        if self.accept_releases is None:
            derived(self, "accept_releases", self.algorithm == "concurrency")
        if self.unit in UNIT_SECONDS:
            derived(
                self, "window_ms",
                UNIT_SECONDS[self.unit] * 1000 * max(1, self.unit_multiplier),
            )
        derived(self, "plain", (
            self.algorithm == "fixed_window" and not self.overdraft and not self.rolling
            and not self.calendar
        ))
        if not self.ident:
            ident = f"{KEY_TAGS[self.algorithm]}{self.window_ms // 1000}"
            if self.calendar:
                ident += f"c{self.timezone}"
            if self.rolling:
                ident += "r"
            if self.index:
                ident += f"i{self.index}"
            if self.candidate:
                # Appended to the live counter key: `~` never occurs in a live ident, so a
                # candidate's counter never meets a live one (nor another candidate's).
                ident = f"~{self.candidate}~{ident}"
            derived(self, "ident", ident)

    @property
    def window_seconds(self) -> int:
        return self.window_ms // 1000
