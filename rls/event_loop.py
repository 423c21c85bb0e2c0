"""Which asyncio event loop rls runs on: uvloop where installed (the default), else asyncio's.

uvloop (libuv) takes ~15 % off the CPU every gRPC call costs on this stack, and the decision
path is measured on it (benchmarks run their floor on the same loop). `--loop asyncio` opts out.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
from collections.abc import Callable
from typing import Any

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def uvloop_installed() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def loop_name(choice: str) -> str:
    """The loop `choice` (auto, uvloop, asyncio) runs on here."""
    if choice == "asyncio" or (choice == "auto" and not uvloop_installed()):
        return "asyncio"
    return "uvloop"


def loop_factory(choice: str) -> LoopFactory | None:
    """For `asyncio.Runner(loop_factory=…)`: uvloop's, or None for asyncio's default."""
    if loop_name(choice) == "asyncio":
        return None
    import uvloop

    factory: LoopFactory = uvloop.new_event_loop
    return factory


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel a background task and wait until it has unwound (its CancelledError is the
    expected ending, not an error). None: nothing to stop."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
