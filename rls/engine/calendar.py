"""Calendar windows: natural day / week (Monday) / month / year in an IANA time zone.

Redis scripts cannot read time-zone data, so the bounds of the window containing `now` are
computed here and passed to the script with the request. They are cached per limit until the
window ends. A day in a zone with a DST change is 23 or 25 hours long; zoneinfo gives the true
local midnights. With `unit_multiplier` N, windows are blocks of N units counted from
1970-01-01 local time (e.g. N=2 days: Jan 1-2, 3-4, ...). SECOND/MINUTE/HOUR windows follow
the zone's current UTC offset (they differ from epoch windows only for fractional offsets).
"""

from __future__ import annotations

from datetime import date, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

from rls.config.model import UNIT_SECONDS, Limit, Unit

_EPOCH_DAY = date(1970, 1, 1)
_EPOCH_MONDAY = date(1969, 12, 29)


@cache
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def _midnight_ms(day: date, tz: ZoneInfo) -> int:
    return int(datetime(day.year, day.month, day.day, tzinfo=tz).timestamp() * 1000)


def _block_start(day: date, unit: Unit, n: int) -> date:
    if unit is Unit.DAY:
        return _EPOCH_DAY + timedelta(days=(day - _EPOCH_DAY).days // n * n)
    if unit is Unit.WEEK:
        return _EPOCH_MONDAY + timedelta(weeks=(day - _EPOCH_MONDAY).days // 7 // n * n)
    if unit is Unit.MONTH:
        months = ((day.year - 1970) * 12 + day.month - 1) // n * n
        return date(1970 + months // 12, months % 12 + 1, 1)
    years = (day.year - 1970) // n * n
    return date(1970 + years, 1, 1)


def _advance(start: date, unit: Unit, n: int) -> date:
    if unit is Unit.DAY:
        return start + timedelta(days=n)
    if unit is Unit.WEEK:
        return start + timedelta(weeks=n)
    if unit is Unit.MONTH:
        months = start.year * 12 + start.month - 1 + n
        return date(months // 12, months % 12 + 1, 1)
    return date(start.year + n, 1, 1)


def calendar_window(now_ms: int, unit: Unit, multiplier: int, timezone: str) -> tuple[int, int]:
    """(start, end) in epoch ms of the calendar window containing `now_ms`."""
    tz = _zone(timezone)
    n = max(1, multiplier)
    if unit in (Unit.SECOND, Unit.MINUTE, Unit.HOUR):
        local = datetime.fromtimestamp(now_ms / 1000, tz)
        offset = local.utcoffset()
        offset_ms = int(offset.total_seconds() * 1000) if offset is not None else 0
        length = UNIT_SECONDS[unit] * 1000 * n
        start = now_ms - (now_ms + offset_ms) % length
        return start, start + length
    day = datetime.fromtimestamp(now_ms / 1000, tz).date()
    first = _block_start(day, unit, n)
    return _midnight_ms(first, tz), _midnight_ms(_advance(first, unit, n), tz)


class CalendarCache:
    """Bounds per calendar limit, recomputed only when `now` leaves the cached window.

    Keyed by the window's definition (unit, multiplier, zone), not by the Limit object: two
    limits with the same calendar share bounds, and a limit of a reloaded config can never meet
    an entry left by another object that happened to get the same id()."""

    def __init__(self) -> None:
        self._bounds: dict[tuple[int, int, str], tuple[int, int, int]] = {}

    def bounds(self, limit: Limit, now_ms: int) -> tuple[int, int, int]:
        key = (int(limit.unit), limit.unit_multiplier, limit.timezone)
        cached = self._bounds.get(key)
        if cached is not None and cached[0] <= now_ms < cached[1]:
            return cached
        start, end = calendar_window(now_ms, limit.unit, limit.unit_multiplier, limit.timezone)
        prev, _ = calendar_window(start - 1, limit.unit, limit.unit_multiplier, limit.timezone)
        result = (start, end, prev)
        if len(self._bounds) > 4096:
            self._bounds.clear()
        self._bounds[key] = result
        return result
