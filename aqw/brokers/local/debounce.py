"""Debounced enqueue (``enqueue(..., key=k, debounce=s)``): the broker contract, the header
that marks a debounced job, and the in-process implementation the memory broker uses.

A burst of enqueues for one key runs one job, with the last payload: while the key's job is
still waiting in the delayed set, a new enqueue replaces its payload and headers and pushes
its start back to ``min(now + debounce, first + debounce_max)``, keeping its id. A job that
has left the delayed set (promoted, started, retried) is never touched: the next enqueue
makes a new job. The Redis broker does the same in one script (``_redis_debounce.py``).
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass

from ...errors import ConfigError
from ...flow import DEBOUNCE_SLACK, due_time
from ...job import Job
from .records import LocalRecords


class DebouncedPublish:
    """The ``Broker`` contract's debounced enqueue; this default refuses it."""

    async def publish_debounced(
        self, job: Job, debounce: float, debounce_max: float | None
    ) -> tuple[str, bool]:
        """Enqueue ``job`` (which has a ``key`` and the ``aqw-debounce`` header) debounced:
        while the job of ``job.key`` is still waiting, replace its payload and headers and
        move its start to ``due_time(...)``, atomically; else schedule ``job`` itself at
        ``now + debounce``. Returns (the waiting job's id, True when an earlier job was
        replaced). Brokers that cannot replace a sent message raise ``ConfigError``."""
        raise ConfigError(
            f"enqueue: debounce needs a broker that can replace a waiting job; the "
            f"{type(self).__name__} broker cannot (a sent message cannot be replaced)"
        )


@dataclass(slots=True)
class _Waiting:
    job_id: str
    entry: tuple[float, int, bytes]  # its entry in the delayed heap
    first: float  # the burst's first enqueue (time.time())
    until: float  # when this record is forgotten (time.time())


class LocalDebounce:
    """The waiting debounced jobs of one in-process queue, by key."""

    __slots__ = ("_seq", "_swept_at", "_waiting")

    def __init__(self) -> None:
        self._waiting: dict[str, _Waiting] = {}
        self._swept_at = 0  # how many records were left by the last sweep
        self._seq = itertools.count(-1, -1)  # heap tie-breakers, apart from the queue's own

    def publish(
        self,
        job: Job,
        debounce: float,
        debounce_max: float | None,
        delayed: list[tuple[float, int, bytes]],
        records: LocalRecords,
    ) -> tuple[str, bool]:
        """``Broker.publish_debounced`` on ``delayed`` (the queue's heap of (due, seq,
        data)), writing the job's record in ``records``."""
        key = job.key
        assert key is not None
        now = time.time()
        held = self._waiting.get(key)
        first, replaced = now, False
        if (
            held is not None
            and held.until > now
            and not records.is_cancelled(held.job_id)
            and _remove(delayed, held.entry)
        ):
            job, first, replaced = job.model_copy(update={"id": held.job_id}), held.first, True
        due = due_time(now, first, debounce, debounce_max)
        entry = (due, next(self._seq), job.encode())
        heapq.heappush(delayed, entry)
        self._waiting[key] = _Waiting(job.id, entry, first, max(due, now) + DEBOUNCE_SLACK)
        records.enqueued(job, due)
        self._sweep(now)
        return job.id, replaced

    def _sweep(self, now: float) -> None:
        """Forget the records past their time, whenever their number has doubled."""
        if len(self._waiting) <= max(1024, 2 * self._swept_at):
            return
        self._waiting = {k: w for k, w in self._waiting.items() if w.until > now}
        self._swept_at = len(self._waiting)


class LocalDebouncedPublish(DebouncedPublish):
    """``publish_debounced`` for a broker whose queue is in this process (the memory broker):
    its shared heap of delayed jobs, job records and ``LocalDebounce``."""

    delayed_heap: list[tuple[float, int, bytes]]
    local_records: LocalRecords
    local_debounce: LocalDebounce

    async def publish_debounced(
        self, job: Job, debounce: float, debounce_max: float | None
    ) -> tuple[str, bool]:
        return self.local_debounce.publish(
            job, debounce, debounce_max, self.delayed_heap, self.local_records
        )


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
