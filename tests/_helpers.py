"""Small helpers shared by the tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aqw


async def eventually(pred: Callable[[], Any], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while True:
        value = pred()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.01)


async def depth(app: aqw.App) -> tuple[int, int, int, int]:
    d = await app.broker.depth()
    return (d.waiting, d.in_flight, d.delayed, d.dead)
