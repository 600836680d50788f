"""A clock for tests that jumps instead of waiting: ``MockClock``.

Inside ``async with MockClock() as clock:`` the running event loop's time and the clock of
the in-process parts (``memory://``: delayed jobs, retries, leases, idempotency records,
job records) are the real ones plus ``clock.offset`` (its wall clock moved on by the
monotonic one, so a step of the machine's wall clock does not reach it), and the offset
grows by itself: each
time the loop has nothing to do but wait for a timer, the clock jumps to that timer at
once (``autojump``), so an ``asyncio.sleep(60)``, a 30 s lease TTL or a retry due in 10
minutes passes in no real time, in the same order as it would have. ``clock.jump(s)``
moves it on by hand.

What it moves: everything timed by the event loop (``asyncio.sleep``, ``asyncio.timeout``,
the worker's lease renewals and deadlines) and everything the memory broker keeps. What
it does not: ``time.time()`` and ``time.monotonic()`` read directly (a job's ``expires``
is checked against the real wall clock), other processes, servers (Redis keeps its own
time), threads. Real I/O still works, but the clock does not wait for it: with sockets or
threads in play, set ``autojump_threshold`` (seconds of real idleness before a jump).

It needs asyncio's own (selector) event loop, not uvloop. Once the block is left the
clock stops jumping but keeps its offset for the rest of the loop's life: the loop's
timers were set in its time."""

from __future__ import annotations

import asyncio
import time
from types import TracebackType
from typing import Any

from ..brokers.local.clock import clock as parts_clock

__all__ = ["MockClock"]


class MockClock:
    """A clock ``offset`` seconds ahead of the real ones, jumping to the next timer when
    the loop is idle (``autojump``; after ``autojump_threshold`` real seconds idle)."""

    def __init__(self, *, autojump: bool = True, autojump_threshold: float = 0.0) -> None:
        if autojump_threshold < 0:
            raise ValueError(f"autojump_threshold must be >= 0, got {autojump_threshold!r}")
        self.autojump = autojump
        self.autojump_threshold = autojump_threshold
        #: Seconds this clock is ahead of the real ones (it only grows).
        self.offset = 0.0
        #: How many times it jumped by itself.
        self.jumps = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        # Its wall clock runs with the monotonic one from here on: a step of the machine's
        # wall clock (a VM's time sync) would otherwise make a job delayed an hour by the
        # wall clock run milliseconds before an hour of the loop's time has passed.
        self._wall0, self._mono0 = time.time(), time.monotonic()

    # -- the Clock of the in-process parts ----------------------------------------------------

    def time(self) -> float:
        """Wall seconds, ``offset`` ahead of the wall clock as it was when this clock was
        made, moved on since by the monotonic clock (so the two never drift apart)."""
        return self._wall0 + (time.monotonic() - self._mono0) + self.offset

    def monotonic(self) -> float:
        """``time.monotonic()`` plus ``offset``: the event loop's time while installed."""
        return time.monotonic() + self.offset

    def jump(self, seconds: float) -> None:
        """Move the clock ``seconds`` on now; the timers due by then fire at the loop's
        next turn."""
        if seconds < 0:
            raise ValueError(f"a clock only moves forward, got {seconds!r}")
        self.offset += seconds

    # -- installing it on the running loop ----------------------------------------------------

    async def __aenter__(self) -> MockClock:
        loop = asyncio.get_running_loop()
        selector: Any = getattr(loop, "_selector", None)
        if selector is None or not hasattr(selector, "select"):
            raise TypeError(
                f"MockClock needs asyncio's selector event loop, not {type(loop).__name__}"
            )
        if getattr(loop, "_aqw_mock_clock", None) is not None:
            raise RuntimeError("this event loop has a MockClock already")
        real_select = selector.select

        def select(timeout: float | None = None) -> list[Any]:
            if not self.autojump or self._loop is None or timeout is None or timeout <= 0:
                return list(real_select(timeout))
            events = list(real_select(min(timeout, self.autojump_threshold)))
            if events:
                return events
            if self.autojump_threshold < timeout:  # idle until the next timer: jump to it
                self.offset += timeout - self.autojump_threshold
                self.jumps += 1
            return []

        loop.time = self.monotonic  # type: ignore[method-assign]
        selector.select = select
        loop._aqw_mock_clock = self  # type: ignore[attr-defined]
        self._loop = loop
        parts_clock.use(self)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._loop = None  # no more jumps; the loop keeps this clock's time
        parts_clock.use(None)
