"""Periodic tasks: when their jobs are due. ``@app.task(schedule=aqw.Cron("*/5 * * * *"))``
or ``@app.task(schedule=aqw.Every(60))`` registers a task every worker's scheduler enqueues
once per tick (``aqw/worker/_scheduler.py``).

Ticks are instants (seconds since the epoch) that every process computes alike: a cron
expression's matches in its time zone, or the multiples of an interval since the epoch. Each
tick is enqueued with the idempotency key ``cron:<task>:<tick, ISO 8601 UTC>``
(``tick_key``), so overlapping schedulers still write one job per tick.
"""

from __future__ import annotations

import abc
import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ._text import error_line, quoted

if TYPE_CHECKING:
    from croniter import croniter

__all__ = ["MAX_CATCH_UP", "MIN_EVERY", "Cron", "Every", "Schedule", "tick_iso", "tick_key"]

#: The most missed ticks a schedule may catch up after an outage.
MAX_CATCH_UP = 10_000
#: The shortest ``Every`` interval, in seconds: a seconds-first cron's resolution (as the
#: second field of arq's cron jobs or sidekiq-cron; plain cron and pg-boss tick by the
#: minute). Each tick is a job plus an idempotency key living ``idempotency_ttl``.
MIN_EVERY = 1.0
#: The longest cron expression or time zone name looked at.
MAX_EXPRESSION = 200


def tick_iso(tick: float) -> str:
    """A tick as ISO 8601 UTC, to the millisecond: ``2026-01-01T12:05:00.000+00:00``."""
    return datetime.fromtimestamp(tick, UTC).isoformat(timespec="milliseconds")


def tick_key(task: str, tick: float) -> str:
    """The idempotency key of ``task``'s job of ``tick``."""
    return f"cron:{task}:{tick_iso(tick)}"


class Schedule(abc.ABC):
    """When a periodic task's jobs are due. Options shared by ``Cron`` and ``Every``:

    - ``catch_up``: after an outage (no scheduler ran), enqueue up to this many of the
      missed ticks, oldest first, before the latest due one; 0 (the default): only the
      latest due tick.
    - ``skip_if_running``: skip a tick while the job of the previous tick enqueued has not
      ended (read from its job record).
    """

    catch_up: int
    skip_if_running: bool

    @abc.abstractmethod
    def describe(self) -> str:
        """The schedule as one short line (``cron */5 * * * * (UTC)``, ``every 60s``)."""

    @abc.abstractmethod
    def expression_problem(self) -> str | None:
        """Why the expression or interval is invalid, or None."""

    @abc.abstractmethod
    def recent(self, after: float | None, until: float, count: int) -> list[float]:
        """Up to ``count`` latest ticks ``t`` with ``after < t <= until``, oldest first."""

    @abc.abstractmethod
    def next_after(self, moment: float) -> float:
        """The first tick strictly after ``moment``."""

    def problem(self) -> str | None:
        """Why this schedule cannot be used (naming the option), or None."""
        wrong = self.expression_problem()
        if wrong is not None:
            return wrong
        if (
            isinstance(self.catch_up, bool)
            or not isinstance(self.catch_up, int)
            or not 0 <= self.catch_up <= MAX_CATCH_UP
        ):
            return f"catch_up must be an integer in [0, {MAX_CATCH_UP}], got {self.catch_up!r}"
        if not isinstance(self.skip_if_running, bool):
            return f"skip_if_running must be True or False, got {self.skip_if_running!r}"
        return None

    def due(self, mark: float | None, now: float) -> list[float]:
        """The ticks to enqueue now, oldest first, after ``mark`` (the last tick handled):
        the latest due tick and up to ``catch_up`` missed ones before it. With no mark (the
        schedule never ran), none: it starts at its next tick."""
        if mark is None:
            return []
        return self.recent(mark, now, self.catch_up + 1)

    def latest(self, now: float) -> float | None:
        """The latest tick at or before ``now`` (None when there is none)."""
        ticks = self.recent(None, now, 1)
        return ticks[0] if ticks else None


@dataclass(frozen=True, slots=True)
class Cron(Schedule):
    """A cron schedule: 5 fields (minute hour day month weekday), or 6 with seconds
    first (``"*/10 * * * * *"``: every 10 seconds), read by ``croniter``, in the time zone
    ``tz`` (an IANA name, default ``"UTC"``)."""

    expression: str
    tz: str = "UTC"
    catch_up: int = 0
    skip_if_running: bool = False

    def describe(self) -> str:
        return f"cron {self.expression} ({self.tz})"

    def _seconds_first(self) -> bool:
        return len(self.expression.split()) == 6

    def _zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)

    def expression_problem(self) -> str | None:
        expression = self.expression
        if (
            not isinstance(expression, str)
            or len(expression) > MAX_EXPRESSION
            or len(expression.split()) not in (5, 6)
        ):
            return f"cron must be 5 or 6 (seconds first) fields, got {quoted(expression)}"
        from croniter import croniter  # loaded by the first cron schedule, not by `import aqw`

        try:
            croniter(expression, second_at_beginning=self._seconds_first())
        except Exception as exc:
            return f"cron {quoted(expression)} does not parse: {error_line(exc)}"
        if not isinstance(self.tz, str) or len(self.tz) > MAX_EXPRESSION:
            return f"tz must be an IANA time zone name, got {quoted(self.tz)}"
        try:
            self._zone()
        except (ZoneInfoNotFoundError, ValueError, TypeError) as exc:
            return f"tz {quoted(self.tz)} is not a known time zone: {error_line(exc)}"
        # A day that never comes (Feb 30, Feb 31, Apr 31): parsed, but no tick ever, and the
        # scheduler would fail on it each time it looks. croniter looks 50 years each way.
        now = time.time()
        try:
            self._iter(now).get_next(float)
            self._iter(now).get_prev(float)
        except Exception:
            return f"cron {quoted(expression)} never fires: no date matches it"
        return None

    def _iter(self, moment: float) -> croniter:
        from croniter import croniter

        start = datetime.fromtimestamp(moment, self._zone())
        return croniter(self.expression, start, second_at_beginning=self._seconds_first())

    def recent(self, after: float | None, until: float, count: int) -> list[float]:
        it = self._iter(until + 0.001)  # get_prev is strict: a tick at ``until`` counts
        out: list[float] = []
        while len(out) < count:
            tick = float(it.get_prev(float))
            if after is not None and tick <= after:
                break
            out.append(tick)
        return out[::-1]

    def next_after(self, moment: float) -> float:
        return float(self._iter(moment).get_next(float))


@dataclass(frozen=True, slots=True)
class Every(Schedule):
    """A fixed interval: ticks at the multiples of ``seconds`` since the epoch, so every
    process agrees on them (``Every(60)``: at the start of each minute)."""

    seconds: float
    catch_up: int = 0
    skip_if_running: bool = False

    def describe(self) -> str:
        return f"every {self.seconds:g}s"

    def expression_problem(self) -> str | None:
        value = self.seconds
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
            return f"every must be a finite number of seconds > 0, got {quoted(value)}"
        if value < MIN_EVERY:
            return (
                f"every must be at least {MIN_EVERY:g} second, got {value:g}: each tick is a "
                "job and an idempotency key that lives idempotency_ttl (a day by default); "
                "for faster work, run one job that loops"
            )
        return None

    def _index(self, moment: float) -> int:
        """The number of the latest tick at or before ``moment``."""
        k = math.floor(moment / self.seconds)
        while k * self.seconds > moment:
            k -= 1
        while (k + 1) * self.seconds <= moment:
            k += 1
        return k

    def recent(self, after: float | None, until: float, count: int) -> list[float]:
        last = self._index(until)
        out = [k * self.seconds for k in range(last - count + 1, last + 1)]
        return [t for t in out if after is None or t > after]

    def next_after(self, moment: float) -> float:
        return (self._index(moment) + 1) * self.seconds
