"""The shared state of one named in-memory queue (``MemoryQueue``) and the queues of this
process, by name: the brokers of one name in a process share one queue, with its parts."""

from __future__ import annotations

import itertools
import json
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from ...job import Job
from ..local import (
    LevelFifos,
    LocalBatchCounts,
    LocalDebounce,
    LocalDepthHistory,
    LocalFairShares,
    LocalJobRates,
    LocalJobRecords,
    LocalLimiter,
    LocalProgress,
    LocalQueueControl,
    LocalRunLimits,
    LocalScheduleMarks,
    LocalWorkerStatus,
    MemoryLeaseBackend,
    Wakeup,
)
from ..local.clock import clock
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
    #: (job id, until) in ``clock.monotonic()`` seconds (``brokers/local/clock.py``).
    key_records: dict[str, tuple[str, float]] = field(default_factory=dict)
    leases: MemoryLeaseBackend = field(default_factory=MemoryLeaseBackend)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    #: Wakes the fetches waiting for a message, in whichever event loop each waits.
    changed: Wakeup = field(default_factory=Wakeup)
    limiter: LocalLimiter = field(default_factory=LocalLimiter)
    run_limits: LocalRunLimits = field(default_factory=LocalRunLimits)
    progress: LocalProgress = field(default_factory=LocalProgress)
    # -- the parts its brokers hand out (made in ``__post_init__``)
    records: LocalJobRecords = field(init=False)
    status: LocalWorkerStatus = field(default_factory=LocalWorkerStatus)
    marks: LocalScheduleMarks = field(default_factory=LocalScheduleMarks)
    history: LocalDepthHistory = field(init=False)
    debounce: LocalDebounce = field(init=False)
    batches: LocalBatchCounts = field(init=False)
    control: LocalQueueControl = field(init=False)
    rates: LocalJobRates = field(default_factory=LocalJobRates)
    #: The fair turns of jobs with a fairness key (``local/fair.py``).
    fair: LocalFairShares = field(init=False)

    def __post_init__(self) -> None:
        self.records = LocalJobRecords(self.name)
        self.history = LocalDepthHistory(self.depth, self.delayed)
        self.debounce = LocalDebounce(self.delayed, self.records)
        self.batches = LocalBatchCounts(
            self.enqueue_now, self.records.cancel, self.result_of, self.end_unrun
        )
        self.control = LocalQueueControl(
            self.waiting, self.delayed, self.notify, lambda: [p.data for p in self.pending.values()]
        )
        self.fair = LocalFairShares(self.records.enqueued, self.notify)

    def result_of(self, job_id: str) -> str | None:
        """A finished job's kept result as JSON text (a flow step's input), or None."""
        info = self.records.info(job_id)
        if info is None or not info.has_result:
            return None
        return json.dumps(info.result)

    def end_unrun(self, job: Job, state: str, keep_for: float) -> None:
        """A job that will never run (a flow step whose parent failed) ends ``state``."""
        self.records.enqueued(job)
        now = repr(clock.time())
        self.records.finish(job, state, {"finished_at": now}, keep_for)

    def enqueue_now(self, job: Job, key: str | None, ttl: float) -> bool:
        """Publish ``job`` now, under the idempotency key ``key`` when given (False, nothing
        published, when the key is taken): a batch's children and callbacks."""
        if key is not None:
            now = clock.monotonic()
            for name in (f"key:{key}", f"done:{key}"):
                held = self.key_records.get(name)
                if held is not None and held[1] > now:
                    return False
            self.key_records[f"key:{key}"] = (job.id, now + ttl)
        self.waiting[self.next_id()] = job.encode()
        self.records.enqueued(job)
        self.notify()
        return True

    async def depth(self) -> QueueDepth:
        waiting = len(self.waiting) + len(self.fair)
        return QueueDepth(waiting, len(self.pending), len(self.delayed), len(self.dlq))

    def next_id(self) -> str:
        return f"{int(time.time() * 1000)}-{next(self.ids)}"

    def bump(self, name: str, n: int = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + n

    def notify(self) -> None:
        self.changed.notify()


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
