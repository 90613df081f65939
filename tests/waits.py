"""Test helper: wait for a condition that another thread owns and signals no event for."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def eventually(cond: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll a condition owned by another thread (the sim engine's scheduler, the router's
    in-flight map and metrics publish no change event to wait on). Backs off (1 ms doubling to
    100 ms) so the poll does not compete with the threads it waits for; the deadline only bounds
    a hang, it measures nothing."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached in {timeout:g} s")
        time.sleep(delay)
        delay = min(2 * delay, 0.1)


async def arrives(cond: Callable[[], bool], timeout: float = 60.0) -> None:
    """``eventually`` for a condition that tasks on the caller's own event loop bring about:
    awaits between polls (same back-off), so those tasks run."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached in {timeout:g} s")
        await asyncio.sleep(delay)
        delay = min(2 * delay, 0.1)
