"""What one stream holds in one limit's counter (`Ledger`), and what a deal hands out
(`Grant`). State only: rls.quota.share moves it, rls.quota.pacing reads it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rls.config.model import Limit
from rls.core.model import Check, Outcome


@dataclass(slots=True)
class Ledger:
    """One limit of one bucket on one stream: what this stream holds in that limit's counter."""

    limit: Limit
    key: str
    stats_key: str | None = None
    reserved: int = 0  # charged to the counter, not yet reported as used
    end_ms: int = 0  # local-clock end of the window `reserved` was charged in (0: unknown)
    old_left: int = 0  # reservation left in the previous window at the last window push
    pushed_at_ms: int = 0  # when that push happened
    mine: int = 0  # net hits this ledger put into the counter's current window
    shared_until_ms: int = 0  # others used the counter recently (see `observe`)
    demand: int = 0  # tokens the bucket's last report projected over one horizon (0: unknown)
    demand_known: bool = False  # `demand` came from a report (not assumed for a new bucket)

    @property
    def shared(self) -> bool:
        return self.shared_until_ms > 0

    def observe(self, used: int, now_ms: int) -> None:
        """Note whether the counter holds more than this ledger put in: others use it too.

        Remembered for two windows (at least 15 s), so right after a reset, when the new
        window is still empty, a counter known to be shared is still dealt as shared.
        """
        if used > self.mine:
            self.shared_until_ms = now_ms + max(2 * self.limit.window_ms, 15_000)
        elif now_ms >= self.shared_until_ms:
            self.shared_until_ms = 0

    @property
    def shadow(self) -> bool:
        return self.limit.shadow_mode


@dataclass(slots=True)
class Grant:
    """The outcome of a deal: `tokens` > 0 → token bucket, 0 → denied for `reset_ms`."""

    tokens: int
    reset_ms: int  # time until the tightest limit's window resets
    remaining: dict[str, int] = field(default_factory=dict)
    # The candidate limits' checks of the report and their outcomes (`Dealer.report`).
    candidates: Sequence[tuple[Check, Outcome]] = ()
