"""Waiting for a condition a real process will make true, with a margin no
loaded machine eats."""
from __future__ import annotations

import asyncio
import time


async def wait_until(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
