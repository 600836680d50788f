"""Pause, the waiting list, delete and promote of a queue held in this process
(``LocalQueueControl``, a ``QueueControl`` part that is not shared): the memory broker keeps
one per queue, over the queue's own waiting FIFOs and delayed heap."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from itertools import islice

from ...job import Job
from ..messages import WaitingJob
from .clock import clock
from .priorities import LevelFifos


class LocalQueueControl:
    """The operator's controls of one in-process queue.

    Args:
        waiting: the queue's waiting entries, one FIFO per level.
        delayed: the queue's heap of (due, sequence, job bytes).
        changed: called after a job was made due now (wakes the queue's waiters).
        running: the wire forms of the jobs handed out and not settled yet.
    """

    __slots__ = ("_changed", "_delayed", "_paused", "_running", "_waiting")

    #: Kept in this process only.
    shared = False

    def __init__(
        self,
        waiting: LevelFifos,
        delayed: list[tuple[float, int, bytes]],
        changed: Callable[[], None],
        running: Callable[[], Iterable[bytes]] = tuple,
    ) -> None:
        self._running = running
        self._waiting = waiting
        self._delayed = delayed
        self._changed = changed
        self._paused = False

    async def pause(self) -> bool:
        was, self._paused = self._paused, True
        return not was

    async def resume(self) -> bool:
        was, self._paused = self._paused, False
        return was

    async def paused(self) -> bool:
        return self._paused

    async def waiting_counts(self) -> dict[int, int]:
        counts = {level: len(fifo) for level, fifo in self._waiting.fifos.items() if fifo}
        counts.setdefault(0, 0)
        return counts

    async def waiting_page(self, level: int, after: str | None, count: int) -> list[WaitingJob]:
        fifo = self._waiting.fifos.get(level)
        if not fifo:
            return []
        entries = iter(fifo.items())
        if after is not None:
            if after not in fifo:  # gone meanwhile: the page after it starts at its place
                entries = ((k, v) for k, v in fifo.items() if _entry_key(k) > _entry_key(after))
            else:
                for key, _ in entries:
                    if key == after:
                        break
        return [WaitingJob(k, level, v) for k, v in islice(entries, count)]

    async def delete_waiting(self, level: int, entry_id: str) -> bool:
        fifo = self._waiting.fifos.get(level)
        return fifo is not None and fifo.pop(entry_id, None) is not None

    async def promote(self, job_id: str) -> bool:
        needle = job_id.encode()
        for i, (_, seq, data) in enumerate(self._delayed):
            if needle in data and _job_id(data) == job_id:
                self._delayed[i] = (clock.time(), seq, data)
                heapq.heapify(self._delayed)
                self._changed()
                return True
        return False

    async def find(self, job_id: str) -> bytes | None:
        needle = job_id.encode()
        waiting = (data for fifo in self._waiting.fifos.values() for data in fifo.values())
        delayed = (data for _, _, data in self._delayed)
        for source in (waiting, self._running(), delayed):
            for data in source:
                if needle in data and _job_id(data) == job_id:
                    return data
        return None


def _entry_key(entry_id: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in entry_id.split("-"))
    except ValueError:
        return (0,)


def _job_id(data: bytes) -> str | None:
    try:
        return Job.decode(data).id
    except Exception:
        return None
