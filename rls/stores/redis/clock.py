"""The store's clock, read locally: milliseconds on Redis TIME without a round trip per call.

Plain fixed windows are chosen by the client (rls/stores/windows.py), and every replica must
pick the same window at the same moment. So each replica reads Redis TIME now and then and
keeps the offset between it and its own monotonic clock (which NTP steps on the host do not
move). A reading is taken from the sample with the shortest round trip, and its error is at
most half that round trip (a fraction of a millisecond on a LAN). Until the first reading the
host's wall clock stands in.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

log = logging.getLogger("rls.backend")

REFRESH_S = 30.0  # monotonic clocks drift by parts per million: a reading a minute is plenty
SAMPLES = 3


def _ms(reply: Any) -> float:
    """Redis TIME's (seconds, microseconds) in ms; a Cluster client answers per node."""
    if isinstance(reply, dict):
        reply = next(iter(reply.values()))
    sec, usec = reply
    return int(sec) * 1000 + int(usec) / 1000


class StoreClock:
    def __init__(self) -> None:
        self._offset_ms = time.time() * 1000 - time.monotonic() * 1000
        self.synced = False
        self.error_ms: float | None = None  # half the round trip of the reading in use

    def now_ms(self) -> int:
        return int(time.monotonic() * 1000 + self._offset_ms)

    def host_skew_ms(self) -> float:
        """How far the store's clock is ahead of this host's wall clock (negative: behind)."""
        return time.monotonic() * 1000 + self._offset_ms - time.time() * 1000

    def sync(self, read_time: Callable[[], Any], samples: int = SAMPLES) -> None:
        """Take a reading (blocking: run it in a thread, its client's socket timeout bounds
        it). Raises what `read_time` raises; the previous offset then stays."""
        best: tuple[float, float] | None = None
        for _ in range(samples):
            sent = time.monotonic()
            store_ms = _ms(read_time())
            back = time.monotonic()
            rtt = back - sent
            if best is None or rtt < best[0]:
                best = (rtt, store_ms - (sent + back) * 500)
        assert best is not None
        self._offset_ms = best[1]
        self.error_ms = best[0] * 500
        self.synced = True

    async def sync_in(self, executor: Executor, read_time: Callable[[], Any]) -> None:
        """`sync` in `executor` (the probe's thread: our own lag cannot skew a reading); warns
        when the store's clock is more than a second off this host's."""
        await asyncio.get_running_loop().run_in_executor(executor, self.sync, read_time)
        skew = self.host_skew_ms()
        if abs(skew) > 1000:  # windows follow the store; say so where an operator looks
            log.warning("redis clock is %.0f ms %s this host's; windows follow redis", abs(skew),
                        "ahead of" if skew > 0 else "behind")

    async def keep(
        self,
        executor: Executor,
        read_time: Callable[[], Any],
        errors: tuple[type[BaseException], ...],
    ) -> None:
        """A reading every REFRESH_S until cancelled; a failed one (`errors`) keeps the last:
        an ill store is the breaker's business, not the clock's."""
        while True:
            await asyncio.sleep(REFRESH_S)
            try:
                await self.sync_in(executor, read_time)
            except errors as exc:
                log.debug("store clock not read: %s", exc)
