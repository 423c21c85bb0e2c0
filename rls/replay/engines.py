"""Deciding a logged request on the log's own time: rls's engine, or a fast path.

`GeneralEngine` is the service's own decision path (RateLimiter over a MemoryBackend) with the
time of each decision injected from the log, so replay decides exactly as rls would have.
`FastEngine` decides domains whose every limit is a plain fixed window (epoch-aligned, no
overdraft, calendar, rolling window, shadow or quota mode, `charge: always`, releases or
candidates) with a dict of counters: per distinct request it derives once which counters it
charges (matching, keys, `replaces`, counters shared by two descriptors: as the limiter
does), then a decision is a few dict look-ups. tests/replay/test_fast_path.py checks it
against `GeneralEngine`, decision by decision. `Replayer` picks one per domain (they keep
separate counters, and a domain's keys never meet another's).

A decision is reported as (over: the request would be answered OVER_LIMIT, the over-limit
descriptors as (index, the limit's config path)).
"""

from __future__ import annotations

from typing import Any

from rls.config.model import Domain, Limit, RateLimitConfig, limits_of
from rls.core.algorithms.base import GRACE_MS
from rls.engine.checks import match_targets
from rls.engine.decision import OVER_LIMIT
from rls.engine.limiter import RateLimiter
from rls.engine.rules import COUNTED, limit_role
from rls.replay.candidates import CandidateMetrics, CandidateTally, CandidateTop
from rls.replay.reader import Shape
from rls.settings import Settings
from rls.stores.memory import MemoryBackend
from rls.stores.windows import plain_window

Result = tuple[bool, tuple[tuple[int, str], ...]]
NOT_LIMITED: Result = (False, ())
TARGETS_MAX = 200_000  # descriptors whose matched limits are remembered (cleared when full)
SWEEP_EVERY = 65_536  # GeneralEngine: decisions between drops of expired counters
SWEEP_MIN = 100_000  # FastEngine: counters held before the first sweep
PREFIX = "rl:"


def fast_domain(dom: Domain, settings: Settings) -> bool:
    """Whether every limit of the domain can be decided by FastEngine."""
    if settings.quota_mode:
        return False
    return all(
        lim.unlimited or (
            plain_window(lim) and not lim.shadow_mode and not lim.quota_mode
            and not lim.charge_always and not lim.accept_releases and not lim.candidates
        )
        for lim in limits_of(dom)
    )


class GeneralEngine:
    """The service's RateLimiter on an in-process store, at the log's times."""

    def __init__(
        self, config: RateLimitConfig, settings: Settings,
        candidates: CandidateTally | None = None,
    ) -> None:
        self.store = MemoryBackend(sweep_interval=0)
        self.candidates = candidates if candidates is not None else CandidateTally()
        metrics = CandidateMetrics(self.candidates)
        self.limiter = RateLimiter(lambda: config, self.store, settings, metrics)
        self.limiter.top = CandidateTop(self.candidates)  # candidate verdicts, at the log's time
        self._n = 0

    async def decide(self, ts: int, shape: Shape) -> Result:
        self._n += 1
        self.candidates.now = ts
        if self._n % SWEEP_EVERY == 0:
            self.store.sweep(ts)  # memory follows the live counters, not the log
        decision = await self.limiter.should_rate_limit(
            shape.domain, shape.descriptors, shape.hits, now_ms=ts
        )
        overs = tuple(
            (i, st.limit.full_key if st.limit is not None else "")
            for i, st in enumerate(decision.statuses) if st.code == OVER_LIMIT
        )
        return decision.overall == OVER_LIMIT, overs


class Cell:
    """One counter: the window it counts (index since the epoch) and what that window used."""

    __slots__ = ("index", "used", "window")

    def __init__(self, window: int) -> None:
        self.index = -1
        self.used = 0
        self.window = window


# A request's plan: its counters (cell, window ms, limit, hits or 1 for a 0-hit check, hits,
# whether they are charged even when the request is rejected: an explicit cost, see
# Limit.charge_always; shared counters folded as the limiter folds them, the first check's
# rule for the sum), per check in the limiter's order (descriptor index, counter index, the
# limit's config path), and the FastEngine epoch it was made in.
Counter = tuple[Cell, int, int, int, int, bool]
Plan = tuple[tuple[Counter, ...], tuple[tuple[int, int, str], ...], int]


class FastEngine:
    """Plain fixed windows only (`fast_domain`): per counter key a Cell, exactly the memory
    store's fixed window for checks without flags (`used + hits <= limit`, a 0-hit check
    `used < limit`; the whole request is charged only when every counter has room).

    A plan holds its cells, so a decision costs no key look-up. Memory follows the live
    counters: when the cells have doubled since the last sweep, those whose window ended more
    than GRACE_MS ago are dropped and every plan is made again (a new epoch)."""

    def __init__(self, config: RateLimitConfig, slot: int) -> None:
        self.config = config
        self.slot = slot  # which of Shape.plans is this engine's
        self.cells: dict[str, Cell] = {}
        self.epoch = 0
        self._sweep_at = SWEEP_MIN
        self._targets: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}

    def plan(self, shape: Shape) -> Plan:
        dom = self.config.domains[shape.domain]
        default_hits = shape.hits if shape.hits > 0 else 1
        matched: list[tuple[int, Limit, str, int, bool]] = []
        replaced: set[str] = set()
        for i, desc in enumerate(shape.descriptors):
            hits = default_hits if desc.hits is None else desc.hits
            cost = desc.hits is not None and desc.hits > 0
            targets = self._targets.get((shape.domain, desc.entries))
            if targets is None:
                if len(self._targets) >= TARGETS_MAX:
                    self._targets.clear()
                targets = self._targets[(shape.domain, desc.entries)] = match_targets(
                    dom, shape.domain, desc.entries, PREFIX
                )
            for limit, key, _, _ in targets:
                replaced.update(limit.replaces)
                if desc.negative:
                    continue  # a release of a limit that accepts none: ignored (limiter)
                matched.append((i, limit, key, hits, cost and not limit.costs_on_allow))
        folded: list[list[Any]] = []
        index: dict[str, int] = {}
        checks = []
        cells = self.cells
        for i, limit, key, hits, always in matched:
            if limit_role(limit, replaced) != COUNTED:
                continue
            j = index.get(key)
            if j is None:
                j = index[key] = len(folded)
                cell = cells.get(key)
                if cell is None:
                    cell = cells[key] = Cell(limit.window_ms)
                folded.append([cell, limit.window_ms, limit.requests_per_unit, 0, always])
            folded[j][3] += hits
            checks.append((i, j, limit.full_key))
        counters = tuple((c, w, r, h if h else 1, h, a) for c, w, r, h, a in folded)
        return counters, tuple(checks), self.epoch

    def decide(self, ts: int, shape: Shape) -> Result:
        plan: Plan | None = shape.plans[self.slot]
        if plan is None or plan[2] != self.epoch:
            if len(self.cells) >= self._sweep_at:
                self.sweep(ts)
            plan = shape.plans[self.slot] = self.plan(shape)
        counters = plan[0]
        moved: list[tuple[Cell, int, int]] | None = None  # cells moved to a new window
        for cell, window, cap, need, _, _ in counters:
            idx = ts // window
            if cell.index != idx:
                if moved is None:
                    moved = []
                moved.append((cell, cell.index, cell.used))
                cell.index = idx
                cell.used = 0
            if cell.used + need > cap:
                if moved:  # a rejected request writes nothing (a late line may read them)
                    for c, index, used in moved:
                        c.index, c.used = index, used
                overs = self._overs(ts, plan)
                self._charge_costs(ts, counters)
                return True, overs
        for cell, _, _, _, hits, _ in counters:
            cell.used += hits
        return NOT_LIMITED

    @staticmethod
    def _charge_costs(ts: int, counters: tuple[Counter, ...]) -> None:
        """A rejected request's explicit costs, charged all the same (Limit.charge_always)."""
        for cell, window, _, _, hits, always in counters:
            if always and hits:
                idx = ts // window
                if cell.index != idx:
                    cell.index = idx
                    cell.used = 0
                cell.used += hits

    @staticmethod
    def _overs(ts: int, plan: Plan) -> tuple[tuple[int, str], ...]:
        """Per descriptor, the limit it reports over: the first over check, replaced by a
        later one that resets later (`outcomes._tighter`)."""
        counters, checks, _ = plan
        chosen: dict[int, tuple[int, str]] = {}
        for i, j, full_key in checks:
            cell, window, cap, need, _, _ = counters[j]
            if (cell.used if cell.index == ts // window else 0) + need <= cap:
                continue
            reset = window - ts % window
            if i not in chosen or reset > chosen[i][0]:
                chosen[i] = (reset, full_key)
        return tuple((i, key) for i, (_, key) in sorted(chosen.items()))

    def sweep(self, ts: int) -> None:
        """Drop the counters the memory store would find expired at `ts` (window end plus
        GRACE_MS: a line logged late still finds its window's count); plans made before hold
        cells that may be gone, so every plan is made again."""
        cells = self.cells
        gone = [k for k, c in cells.items() if (c.index + 1) * c.window + GRACE_MS < ts]
        for key in gone:
            del cells[key]
        self.epoch += 1
        self._sweep_at = max(SWEEP_MIN, 2 * len(cells))


class Replayer:
    """One config's decisions: FastEngine for the domains it can decide, GeneralEngine for the
    others (and for `fast=False`). Requests of an unknown domain are not limited."""

    def __init__(self, config: RateLimitConfig, slot: int, fast: bool = True) -> None:
        settings = Settings(local_cache=False)
        self.candidates = CandidateTally()  # what the config's candidate limits would answer
        self.has_candidates = any(dom.has_candidates for dom in config.domains.values())
        self.general = GeneralEngine(config, settings, self.candidates)
        self.fast = FastEngine(config, slot)
        self.fast_domains = frozenset(
            name for name, dom in config.domains.items() if fast and fast_domain(dom, settings)
        )

    async def decide(self, ts: int, shape: Shape) -> Result:
        if shape.domain in self.fast_domains:
            return self.fast.decide(ts, shape)
        return await self.general.decide(ts, shape)
