"""The shared state of one named in-memory queue (``MemoryQueue``) and the queues of this
process, by name: the brokers of one name in a process share one queue, with its parts."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from ..local import (
    LevelFifos,
    LocalDebounce,
    LocalDepthHistory,
    LocalFairShares,
    LocalJobRecords,
    LocalLimiter,
    LocalProgress,
    LocalRunLimits,
    LocalScheduleMarks,
    LocalWorkerStatus,
    MemoryLeaseBackend,
)
from ..messages import DeadJob, QueueDepth


@dataclass
class Pending:
    """A delivery handed out and not settled yet."""

    data: bytes
    consumer: str
    since: float
    delivered: int


@dataclass
class MemoryQueue:
    """The shared state of one named in-memory queue."""

    name: str
    #: One FIFO per priority level (``q.waiting[id] = data`` files it under its level).
    waiting: LevelFifos = field(default_factory=LevelFifos)
    pending: dict[str, Pending] = field(default_factory=dict)
    delayed: list[tuple[float, int, bytes]] = field(default_factory=list)
    dlq: OrderedDict[str, DeadJob] = field(default_factory=OrderedDict)
    stats: dict[str, int] = field(default_factory=dict)
    #: Idempotency records: ``key:<key>`` (enqueued) and ``done:<key>`` (completed), each
    #: (job id, until) in ``time.monotonic()`` seconds.
    key_records: dict[str, tuple[str, float]] = field(default_factory=dict)
    leases: MemoryLeaseBackend = field(default_factory=MemoryLeaseBackend)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    changed: asyncio.Event | None = None
    limiter: LocalLimiter = field(default_factory=LocalLimiter)
    run_limits: LocalRunLimits = field(default_factory=LocalRunLimits)
    progress: LocalProgress = field(default_factory=LocalProgress)
    # -- the parts its brokers hand out (made in ``__post_init__``)
    records: LocalJobRecords = field(init=False)
    status: LocalWorkerStatus = field(default_factory=LocalWorkerStatus)
    marks: LocalScheduleMarks = field(default_factory=LocalScheduleMarks)
    history: LocalDepthHistory = field(init=False)
    debounce: LocalDebounce = field(init=False)
    #: The fair turns of jobs with a fairness key (``local/fair.py``).
    fair: LocalFairShares = field(init=False)

    def __post_init__(self) -> None:
        self.records = LocalJobRecords(self.name)
        self.history = LocalDepthHistory(self.depth, self.delayed)
        self.debounce = LocalDebounce(self.delayed, self.records)
        self.fair = LocalFairShares(self.records.enqueued, self.notify)

    async def depth(self) -> QueueDepth:
        waiting = len(self.waiting) + len(self.fair)
        return QueueDepth(waiting, len(self.pending), len(self.delayed), len(self.dlq))

    def next_id(self) -> str:
        return f"{int(time.time() * 1000)}-{next(self.ids)}"

    def bump(self, name: str, n: int = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + n

    def notify(self) -> None:
        if self.changed is not None:
            self.changed.set()


_QUEUES: dict[str, MemoryQueue] = {}


def memory_queue(name: str) -> MemoryQueue:
    """This process's in-memory queue ``name``, made on first use."""
    q = _QUEUES.get(name)
    return q if q is not None else _QUEUES.setdefault(name, MemoryQueue(name))


def reset_memory_queues() -> None:
    """Forget every in-memory queue of this process, with their heartbeats and job records
    (for tests)."""
    for name in list(_QUEUES):
        delete_memory_queue(name)


def delete_memory_queue(name: str) -> None:
    """Forget the in-memory queue ``name`` of this process, with everything in it (its
    jobs, dead-letter queue, heartbeats and job records: callers waiting for one of its
    jobs get ``aqw.UnknownJob``); a later broker starts it afresh."""
    q = _QUEUES.pop(name, None)
    if q is not None:
        q.records.clear()
