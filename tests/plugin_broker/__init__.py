"""A broker written outside aqw, through its public contract only: ``plug://NAME``, an
in-process queue (a list, a dict of deliveries handed out, a heap of delayed jobs, a DLQ)
built on ``aqw.brokers.base.Broker`` and the public in-process parts of
``aqw.brokers.local``. It is what docs/brokers/writing-a-broker.md walks through; the tests
install it with an ``aqw.brokers`` entry point (``test_plugin_broker.py``).

Nothing here imports a private module or name of aqw (``test_plugin_broker.py`` checks)."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from aqw.brokers.base import Broker
from aqw.brokers.local import (
    LocalJobRecords,
    LocalScheduleMarks,
    LocalStartGuard,
    LocalWorkerStatus,
    MemoryLeaseBackend,
    still_ours,
)
from aqw.brokers.messages import DeadJob, Delivery, Failure, Finish, QueueDepth
from aqw.flow import Limits
from aqw.job import Job
from aqw.lease import Lease, LeaseBackend

__all__ = ["PlugBroker", "from_url"]


@dataclass
class _Held:
    data: bytes
    consumer: str
    since: float
    count: int


@dataclass
class _Queue:
    name: str
    waiting: list[tuple[str, bytes, int]] = field(default_factory=list)  # (id, data, count)
    held: dict[str, _Held] = field(default_factory=dict)
    delayed: list[tuple[float, int, bytes]] = field(default_factory=list)
    dlq: OrderedDict[str, DeadJob] = field(default_factory=OrderedDict)
    counts: dict[str, int] = field(default_factory=dict)
    leases: MemoryLeaseBackend = field(default_factory=MemoryLeaseBackend)
    ids: itertools.count[int] = field(default_factory=itertools.count)
    records: LocalJobRecords = field(init=False)
    status: LocalWorkerStatus = field(default_factory=LocalWorkerStatus)
    marks: LocalScheduleMarks = field(default_factory=LocalScheduleMarks)
    #: Set when a job is added to ``waiting`` (wakes a blocking fetch).
    added: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.records = LocalJobRecords(self.name)

    def add(self, entry_id: str, data: bytes, count: int = 0) -> None:
        self.waiting.append((entry_id, data, count))
        self.added.set()

    def new_id(self) -> str:
        return f"plug-{next(self.ids)}"

    def bump(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1


QUEUES: dict[str, _Queue] = {}


def from_url(url: str, queue: str) -> PlugBroker:
    """The entry point: ``plug://NAME`` (or ``plug://`` and the App's queue)."""
    return PlugBroker(urlsplit(url).netloc or queue)


class PlugBroker(Broker):
    """An in-process queue; brokers of one name in a process share it (and its parts)."""

    system = "plug"
    in_process = True

    def __init__(self, queue: str) -> None:
        self._q = q = QUEUES.setdefault(queue, _Queue(queue))
        super().__init__(queue, records=q.records, status=q.status, marks=q.marks)

    def sibling(self, queue: str) -> PlugBroker:
        return PlugBroker(queue)

    async def connect(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def publish(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            self._q.add(self._q.new_id(), job.encode())
            self._q.records.enqueued(job)

    async def schedule(self, jobs: Sequence[Job], run_at: float) -> None:
        for job in jobs:
            heapq.heappush(self._q.delayed, (run_at, next(self._q.ids), job.encode()))
            self._q.records.enqueued(job, run_at)

    async def promote_due(self) -> float | None:
        q, now = self._q, time.time()
        while q.delayed and q.delayed[0][0] <= now:
            q.add(q.new_id(), heapq.heappop(q.delayed)[2])
        return max(0.0, q.delayed[0][0] - now) if q.delayed else None

    async def fetch(self, count: int, block: float, share: float = 0.0) -> list[Delivery]:
        """Up to ``count`` deliveries, waiting up to ``block`` seconds for the first (no
        priority levels here: ``share`` is unused)."""
        if not self._q.waiting and block > 0:
            self._q.added.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(block):
                    await self._q.added.wait()
        out = []
        while self._q.waiting and len(out) < count:
            entry_id, data, before = self._q.waiting.pop(0)
            self._q.held[entry_id] = _Held(data, self.consumer, time.monotonic(), before + 1)
            out.append(Delivery(entry_id, data, delivery_count=before + 1))
        return out

    async def reclaim(
        self, count: int, lease_ttl: Callable[[Job | None], float], min_idle: float
    ) -> list[Delivery]:
        out, now = [], time.monotonic()
        for entry_id, held in list(self._q.held.items()):
            if len(out) >= count:
                break
            try:
                job: Job | None = Job.decode(held.data)
            except ValueError:
                job = None
            idle = now - held.since
            if idle < max(min_idle, lease_ttl(job)):
                continue
            if job is not None and self._q.leases.owner(self.job_lease_key(job)) is not None:
                continue  # a live holder is never robbed
            held.consumer, held.since, held.count = self.consumer, now, held.count + 1
            out.append(Delivery(entry_id, held.data, delivery_count=held.count))
        return out

    async def give_back_unstarted(self, running: set[str]) -> int:
        mine = [i for i, h in self._q.held.items() if h.consumer == self.consumer]
        given = [i for i in mine if i not in running]
        for entry_id in given:
            await self.give_back(Delivery(entry_id, self._q.held[entry_id].data), None)
        return len(given)

    async def keep_alive(self, delivery: Delivery) -> bool:
        held = self._q.held.get(delivery.id)
        if held is None or held.consumer != self.consumer:
            return False
        held.since = time.monotonic()
        return True

    def lease_backend(self) -> LeaseBackend:
        return self._q.leases

    def job_lease_backend(
        self, job: Job, limits: Limits | None = None, delivery: Delivery | None = None
    ) -> LeaseBackend:
        check = still_ours(self, delivery)  # a start only for a live delivery
        return LocalStartGuard(self._q.leases, self._q.records, job, self.consumer, check)

    def _take(self, delivery: Delivery, lease: Lease | None) -> _Held | None:
        """The delivery, taken off the held ones, when it is still this consumer's: its
        lease held by this token, or without one, handed to this consumer."""
        held = self._q.held.get(delivery.id)
        if held is None:
            return None
        owner = self._q.leases.owner(lease.key) if lease is not None else None
        if lease is not None and owner is not None and owner != lease.token:
            return None
        if owner is None and held.consumer != self.consumer:
            return None
        if lease is not None and owner is not None:
            self._q.leases.drop(lease.key)
        return self._q.held.pop(delivery.id)

    async def _ack(
        self,
        delivery: Delivery,
        job: Job | None,
        lease: Lease | None,
        finish: Finish,
        record_ttl: float,
    ) -> bool:
        if self._take(delivery, lease) is None:
            return False
        self._q.bump("processed")
        return True

    async def _retry(
        self,
        delivery: Delivery,
        job: Job,
        run_at: float,
        lease: Lease | None,
        failure: Failure | None,
    ) -> bool:
        if self._take(delivery, lease) is None:
            return False
        heapq.heappush(self._q.delayed, (run_at, next(self._q.ids), job.encode()))
        self._q.bump("retried")
        return True

    async def _dead_letter(
        self,
        delivery: Delivery,
        job: Job | None,
        failure: Failure,
        attempts: int,
        lease: Lease | None,
        keep_for: float,
    ) -> str | None:
        if self._take(delivery, lease) is None:
            return None
        entry_id = self._q.new_id()
        self._q.dlq[entry_id] = DeadJob(
            id=entry_id,
            data=delivery.data,
            task=job.task if job else "",
            job_id=job.id if job else "",
            error_type=failure.error_type,
            error=failure.error,
            traceback=failure.traceback,
            attempts=attempts,
            first_failed_at=failure.first_failed_at or failure.failed_at,
            last_failed_at=failure.failed_at,
            worker=failure.worker,
        )
        self._q.bump("dead")
        return entry_id

    async def _give_back(self, delivery: Delivery, lease: Lease | None, job: Job | None) -> bool:
        held = self._take(delivery, lease)
        if held is None:
            return False
        self._q.add(delivery.id, held.data, held.count)
        return True

    async def depth(self) -> QueueDepth:
        q = self._q
        return QueueDepth(len(q.waiting), len(q.held), len(q.delayed), len(q.dlq))

    async def stats(self) -> dict[str, int]:
        return dict(self._q.counts)

    async def dlq_list(self, count: int = 100, after: str | None = None) -> list[DeadJob]:
        entries = list(self._q.dlq.values())
        if after is not None:
            ids = list(self._q.dlq)
            entries = entries[ids.index(after) + 1 :] if after in self._q.dlq else []
        return entries[:count]

    async def dlq_get(self, entry_id: str) -> DeadJob | None:
        return self._q.dlq.get(entry_id)

    async def dlq_replay(self, entries: Sequence[tuple[str, Job]]) -> int:
        replayed = 0
        for entry_id, job in entries:
            if self._q.dlq.pop(entry_id, None) is not None:
                self._q.add(self._q.new_id(), job.encode())
                self._q.records.replayed(job)
                replayed += 1
        return replayed

    async def dlq_delete(self, entry_ids: Sequence[str]) -> int:
        return sum(self._q.dlq.pop(i, None) is not None for i in entry_ids)
