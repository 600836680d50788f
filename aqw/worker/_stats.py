"""Sliding-window counters and duration quantiles kept by each worker, cheap to record
(one dict or list update per event) and summarised in its heartbeat."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

#: Duration histogram buckets grow by this factor from 0.1 ms; 100 buckets reach ~ 8 hours.
_GROWTH = 1.2
_BASE = 0.0001
_BUCKETS = 100
_LOG_GROWTH = math.log(_GROWTH)


def _bucket(seconds: float) -> int:
    if seconds <= _BASE:
        return 0
    return min(_BUCKETS - 1, 1 + int(math.log(seconds / _BASE) / _LOG_GROWTH))


def _bucket_upper(index: int) -> float:
    return _BASE * _GROWTH**index


class _Slot:
    __slots__ = ("counts", "durations", "start")

    def __init__(self, start: float) -> None:
        self.start = start
        self.counts: dict[str, int] = {}
        self.durations = [0] * _BUCKETS


class SlidingStats:
    """Event counts and a duration histogram over the last ``window`` seconds, in slots of
    ``slot`` seconds (default: 5 minutes in 10-second slots)."""

    def __init__(
        self, window: float = 300.0, slot: float = 10.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.window = window
        self.slot = slot
        self._clock = clock
        self._slots: deque[_Slot] = deque()

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

    def count(self, event: str, n: int = 1) -> None:
        """Count ``n`` occurrences of ``event`` now."""
        counts = self._current().counts
        counts[event] = counts.get(event, 0) + n

    def duration(self, seconds: float) -> None:
        """Record one processing duration."""
        self._current().durations[_bucket(seconds)] += 1

    def _recent(self, seconds: float) -> list[_Slot]:
        horizon = self._clock() - seconds
        return [s for s in self._slots if s.start + self.slot > horizon]

    def totals(self, seconds: float) -> dict[str, int]:
        """Event counts over the last ``seconds`` (rounded to whole slots)."""
        out: dict[str, int] = {}
        for slot in self._recent(seconds):
            for name, n in slot.counts.items():
                out[name] = out.get(name, 0) + n
        return out

    def quantiles(
        self, qs: tuple[float, ...] = (0.5, 0.99), seconds: float | None = None
    ) -> dict[str, float]:
        """Duration quantiles (upper bucket bounds, within 20%) over the last ``seconds``."""
        merged = [0] * _BUCKETS
        for slot in self._recent(seconds or self.window):
            for i, n in enumerate(slot.durations):
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
                    out[name] = _bucket_upper(i)
                    break
        return out
