"""The clock of the in-process parts: ``clock.time()`` (wall seconds) and
``clock.monotonic()``, read through one object so a test can move time on without waiting
(``aqw.testing.MockClock``). By default they are ``time.time`` and ``time.monotonic``."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A source of time: wall seconds since the epoch, and a monotonic reading."""

    def time(self) -> float: ...
    def monotonic(self) -> float: ...
    @property
    def offset(self) -> float:
        """Seconds this clock is ahead of the real ones."""


class SystemClock:
    """The real clocks."""

    offset = 0.0

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class CurrentClock:
    """The clock the in-process parts read: ``SYSTEM`` unless a test put another in
    (``use``)."""

    __slots__ = ("source",)

    def __init__(self) -> None:
        self.source: Clock = SYSTEM

    def time(self) -> float:
        return self.source.time()

    def monotonic(self) -> float:
        return self.source.monotonic()

    def offset(self) -> float:
        """Seconds the clock in use is ahead of the real ones: a wall time computed from
        ``time.time()`` outside (a job's ``run_at``) plus this is a time of this clock."""
        return self.source.offset

    def use(self, source: Clock | None) -> None:
        """Read ``source`` from now on (None: the real clocks again)."""
        self.source = source if source is not None else SYSTEM


SYSTEM = SystemClock()
#: What every in-process part reads the time from.
clock = CurrentClock()
