"""Debounced enqueue in the process (``LocalDebounce``, a ``Debounce`` part that is not
shared), for the memory broker: ``enqueue(..., key=k, debounce=s)``.

A burst of enqueues for one key runs one job, with the last payload: while the key's job is
still waiting in the delayed set, a new enqueue replaces its payload and headers and pushes
its start back to ``min(now + debounce, first + debounce_max)``, keeping its id. A job that
has left the delayed set (promoted, started, retried) is never touched: the next enqueue
makes a new job. The Redis broker does the same in one script (``redis/_debounce.py``); the header
that marks a debounced job and the due time are in ``aqw.flow``.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

from ...flow import DEBOUNCE_SLACK, due_time
from ...job import Job
from .clock import clock
from .records import LocalJobRecords


@dataclass(slots=True)
class _Waiting:
    job_id: str
    entry: tuple[float, int, bytes]  # its entry in the delayed heap
    first: float  # the burst's first enqueue (clock.time())
    until: float  # when this record is forgotten (clock.time())


class LocalDebounce:
    """The waiting debounced jobs of one in-process queue, by key.

    Args:
        delayed: the queue's heap of (due, sequence, job bytes) of delayed jobs.
        records: the queue's job records.
    """

    __slots__ = ("_delayed", "_records", "_seq", "_swept_at", "_waiting")

    #: Kept in this process only.
    shared = False

    def __init__(
        self,
        delayed: list[tuple[float, int, bytes]],
        records: LocalJobRecords,
    ) -> None:
        self._delayed = delayed
        self._records = records
        self._waiting: dict[str, _Waiting] = {}
        self._swept_at = 0  # how many records were left by the last sweep
        self._seq = itertools.count(-1, -1)  # heap tie-breakers, apart from the queue's own

    async def publish(
        self, job: Job, debounce: float, debounce_max: float | None
    ) -> tuple[str, bool]:
        key = job.key
        assert key is not None
        now = clock.time()
        held = self._waiting.get(key)
        first, replaced = now, False
        if (
            held is not None
            and held.until > now
            and not self._records.is_cancelled(held.job_id)
            and _remove(self._delayed, held.entry)
        ):
            job, first, replaced = job.model_copy(update={"id": held.job_id}), held.first, True
        due = due_time(now, first, debounce, debounce_max)
        entry = (due, next(self._seq), job.encode())
        heapq.heappush(self._delayed, entry)
        self._waiting[key] = _Waiting(job.id, entry, first, max(due, now) + DEBOUNCE_SLACK)
        self._records.enqueued(job, due)
        self._sweep(now)
        return job.id, replaced

    def _sweep(self, now: float) -> None:
        """Forget the records past their time, whenever their number has doubled."""
        if len(self._waiting) <= max(1024, 2 * self._swept_at):
            return
        self._waiting = {k: w for k, w in self._waiting.items() if w.until > now}
        self._swept_at = len(self._waiting)


def _remove(heap: list[tuple[float, int, bytes]], entry: tuple[float, int, bytes]) -> bool:
    """Take ``entry`` out of ``heap``; False when it is no longer there (it was promoted)."""
    try:
        i = heap.index(entry)
    except ValueError:
        return False
    last = heap.pop()
    if i < len(heap):
        heap[i] = last
        heapq.heapify(heap)
    return True
