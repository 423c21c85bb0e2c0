"""Background steps of quota mode (giving reservations back) that no caller waits for, kept
referenced until done so a drain can wait for them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable


class Background:
    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()

    def __bool__(self) -> bool:
        return bool(self.tasks)

    def spawn(self, step: Awaitable[None]) -> None:
        task = asyncio.ensure_future(step)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def wait(self) -> None:
        """Until every step spawned so far is done (failures were logged by the steps)."""
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
