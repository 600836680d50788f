"""Sliding-window counters and duration quantiles kept by each worker, cheap to record
(one dict or list update per event, keyed by event and task), summarised in its heartbeat
and added to the queue's rates (``broker.rates``) once per heartbeat, slot by slot
(``unflushed``): never a broker call per job."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from ..brokers.tallies import BUCKETS, TaskTally, bucket_upper, duration_bucket

#: minute start -> task -> tally (``JobRates.add``).
Tallies = dict[float, dict[str, TaskTally]]


class _Slot:
    __slots__ = ("counts", "durations", "start")

    def __init__(self, start: float) -> None:
        self.start = start
        self.counts: dict[tuple[str, str], int] = {}
        self.durations: dict[str, list[int]] = {}


class SlidingStats:
    """Event counts and a duration histogram over the last ``window`` seconds, in slots of
    ``slot`` seconds (default: 5 minutes in 10-second slots), per task."""

    def __init__(
        self, window: float = 300.0, slot: float = 10.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.window = window
        self.slot = slot
        self._clock = clock
        self._slots: deque[_Slot] = deque()
        #: The start of the last slot added to the queue's rates (``unflushed``).
        self.flushed = -1.0

    def _current(self) -> _Slot:
        now = self._clock()
        start = now - (now % self.slot)
        slots = self._slots
        if not slots or slots[-1].start != start:
            slots.append(_Slot(start))
            horizon = now - self.window - self.slot
            while slots and slots[0].start < horizon:
                slots.popleft()
        return slots[-1]

    def count(self, event: str, task: str = "", n: int = 1) -> None:
        """Count ``n`` occurrences of ``event`` (of ``task``) now."""
        counts = self._current().counts
        key = (event, task)
        counts[key] = counts.get(key, 0) + n

    def duration(self, seconds: float, task: str = "") -> None:
        """Record one processing duration of ``task``."""
        durations = self._current().durations
        try:  # no call on the usual path: the task has a histogram in this slot
            histogram = durations[task]
        except KeyError:
            histogram = durations[task] = [0] * BUCKETS
        histogram[duration_bucket(seconds)] += 1

    def _recent(self, seconds: float) -> list[_Slot]:
        horizon = self._clock() - seconds
        return [s for s in self._slots if s.start + self.slot > horizon]

    def totals(self, seconds: float) -> dict[str, int]:
        """Event counts over the last ``seconds`` (rounded to whole slots), all tasks."""
        out: dict[str, int] = {}
        for slot in self._recent(seconds):
            for (name, _), n in slot.counts.items():
                out[name] = out.get(name, 0) + n
        return out

    def quantiles(
        self, qs: tuple[float, ...] = (0.5, 0.99), seconds: float | None = None
    ) -> dict[str, float]:
        """Duration quantiles (upper bucket bounds, within 20%) over the last ``seconds``."""
        merged = [0] * BUCKETS
        for slot in self._recent(seconds or self.window):
            for histogram in slot.durations.values():
                for i, n in enumerate(histogram):
                    if n:
                        merged[i] += n
        total = sum(merged)
        out: dict[str, float] = {}
        for q in qs:
            name = f"p{round(q * 100):d}"
            if total == 0:
                out[name] = 0.0
                continue
            rank = q * total
            seen = 0
            for i, n in enumerate(merged):
                seen += n
                if seen >= rank:
                    out[name] = bucket_upper(i)
                    break
        return out

    def unflushed(self, final: bool = False) -> tuple[Tallies, float]:
        """The counts of the slots not yet added to the queue's rates, by minute and task,
        and the mark to pass to ``flushed_to`` once they are added. Only whole slots (the
        current one still counts) unless ``final`` (the worker stops)."""
        current = self._clock() - (self._clock() % self.slot)
        out: Tallies = {}
        mark = self.flushed
        for slot in self._slots:
            if slot.start <= self.flushed or (slot.start >= current and not final):
                continue
            mark = max(mark, slot.start)
            minute = out.setdefault(slot.start - slot.start % 60, {})
            for (name, task), n in slot.counts.items():
                counts = minute.setdefault(task, TaskTally()).counts
                counts[name] = counts.get(name, 0) + n
            for task, histogram in slot.durations.items():
                spread = minute.setdefault(task, TaskTally()).durations
                for i, n in enumerate(histogram):
                    if n:
                        spread[i] = spread.get(i, 0) + n
        return out, mark

    def flushed_to(self, mark: float) -> None:
        """The slots up to ``mark`` are in the queue's rates."""
        self.flushed = max(self.flushed, mark)
