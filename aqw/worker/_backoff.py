"""Riding out a broker that is briefly unreachable: which errors mean that, backoff with
jitter, and settle steps retried until a deadline."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger("aqw.worker")


class Backoff:
    """Exponential backoff with full jitter for reconnect loops."""

    def __init__(self, base: float = 0.1, cap: float = 5.0) -> None:
        self.base, self.cap, self.n = base, cap, 0

    def next(self) -> float:
        """The next delay in seconds."""
        self.n += 1
        return random.uniform(0, min(self.cap, self.base * 2 ** min(self.n, 16)))

    def reset(self) -> None:
        self.n = 0


async def with_retries(
    step: Callable[[], Awaitable[bool]],
    within: float,
    transient: tuple[type[BaseException], ...],
) -> bool:
    """Run a settle step, retrying a lost connection for up to ``within`` seconds.

    Once sent, a step completes even if the caller is cancelled (the command batcher owns
    the round trip); the retries run shielded for the same reason. False when the step
    was refused, or could not be sent in time (the job is then redelivered)."""
    try:
        return await step()
    except transient as exc:
        first_error: BaseException = exc
    deadline = time.monotonic() + within
    backoff = Backoff(0.05, 2.0)

    async def again() -> bool:
        error = first_error
        while time.monotonic() < deadline:
            await asyncio.sleep(backoff.next())
            try:
                return await step()
            except transient as exc:
                error = exc
        log.error("could not settle after retrying (%r); it will be redelivered", error)
        return False

    return await asyncio.shield(asyncio.ensure_future(again()))
