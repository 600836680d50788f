"""Throughput and durations of a queue held in this process (``LocalJobRates``, a
``JobRates`` part that is not shared): per-minute buckets for ``MINUTE_KEEP`` seconds and
per-hour buckets for ``HOUR_KEEP`` seconds, the older ones dropped as new ones come."""

from __future__ import annotations

from ..tallies import HOUR_KEEP, MINUTE_KEEP, TaskTally

Buckets = dict[float, dict[str, TaskTally]]


class LocalJobRates:
    """The rates of one in-process queue, bounded by time."""

    __slots__ = ("_hours", "_minutes")

    #: Kept in this process only.
    shared = False

    def __init__(self) -> None:
        self._minutes: Buckets = {}
        self._hours: Buckets = {}

    async def add(self, tallies: Buckets) -> None:
        for minute, tasks in tallies.items():
            for into, start in ((self._minutes, minute), (self._hours, minute - minute % 3600)):
                bucket = into.setdefault(start, {})
                for task, tally in tasks.items():
                    bucket.setdefault(task, TaskTally()).merge(tally)
        if tallies:
            newest = max(tallies)
            _trim(self._minutes, newest - MINUTE_KEEP)
            _trim(self._hours, newest - HOUR_KEEP)

    async def read(self, since: float, hourly: bool) -> Buckets:
        source = self._hours if hourly else self._minutes
        return {start: tasks for start, tasks in sorted(source.items()) if start >= since}


def _trim(buckets: Buckets, horizon: float) -> None:
    for start in [s for s in buckets if s < horizon]:
        del buckets[start]
