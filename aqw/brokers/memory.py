"""The in-process broker: the embedded default, and a test double with the same semantics
as the Redis Streams broker (pending entries, reclaim after idle, delayed set, capped DLQ,
leases with fencing tokens, job records). Brokers with the same name in one process share
one queue."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..job import Job
from ..lease import Lease, LeaseBackend
from ..record import DEFAULT_KEEP_FOR
from ._debounce import LocalDebounce, LocalDebouncedPublish, completion_key
from ._flow import Limits
from ._levels import LevelFifos
from ._local_limits import LimitedStart, LocalLimiter
from ._local_records import LocalRecords
from ._local_status import LocalStatus
from ._memory_leases import MemoryLeaseBackend as MemoryLeaseBackend  # re-exported
from ._views import DepthSamples, LocalViews
from .base import Broker, DeadJob, Delivery, Failure, Finish, QueueDepth, failure_fields


@dataclass
class _Pending:
    data: bytes
    consumer: str
    since: float
    delivered: int


@dataclass
class _Queue:
    """The shared state of one named in-memory queue."""

    #: The job records (``app.job``), shared by the queue's brokers in this process.
    job_records: LocalRecords
    #: One FIFO per priority level (``q.waiting[id] = data`` files it under its level).
    waiting: LevelFifos = field(default_factory=LevelFifos)
    pending: dict[str, _Pending] = field(default_factory=dict)
    delayed: list[tuple[float, int, bytes]] = field(default_factory=list)
    dlq: OrderedDict[str, DeadJob] = field(default_factory=OrderedDict)
    stats: dict[str, int] = field(default_factory=dict)
    #: Idempotency records: ``key:<key>`` (enqueued) and ``done:<key>`` (completed), each
    #: (job id, until) in ``time.monotonic()`` seconds.
    key_records: dict[str, tuple[str, float]] = field(default_factory=dict)
    leases: MemoryLeaseBackend = field(default_factory=MemoryLeaseBackend)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    changed: asyncio.Event | None = None
    status: LocalStatus = field(default_factory=LocalStatus)
    limiter: LocalLimiter = field(default_factory=LocalLimiter)
    debounce: LocalDebounce = field(default_factory=LocalDebounce)
    depth_samples: DepthSamples = field(default_factory=DepthSamples)

    def next_id(self) -> str:
        return f"{int(time.time() * 1000)}-{next(self.ids)}"

    def bump(self, name: str, n: int = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + n

    def notify(self) -> None:
        if self.changed is not None:
            self.changed.set()


_QUEUES: dict[str, _Queue] = {}


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
        q.job_records.clear()


class MemoryBroker(LocalViews, LocalDebouncedPublish, Broker):
    """An in-process queue. ``MemoryBroker("q")`` instances in one process share queue ``q``."""

    system = "memory"
    enforces_limits = True  # for the workers of this process (``_local_limits.py``)

    def __init__(self, queue: str = "default", *, dlq_limit: int = 100_000) -> None:
        super().__init__(queue)
        self.dlq_limit = dlq_limit
        q = _QUEUES.get(queue)
        self._q = q if q is not None else _QUEUES.setdefault(queue, _Queue(LocalRecords(queue)))
        self.local_status = self._q.status  # brokers of one queue share its status too
        self.local_records = self._q.job_records  # and its job records
        self.depth_samples = self._q.depth_samples  # and its depth history (LocalViews)
        self.delayed_heap = self._q.delayed
        self.local_debounce = self._q.debounce  # the keys' waiting jobs (LocalDebouncedPublish)

    def describe(self) -> str:
        return f"memory://{self.queue}"

    async def connect(self) -> None:
        if self._q.changed is None:
            self._q.changed = asyncio.Event()

    async def close(self) -> None:
        return None

    async def publish(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            self._q.waiting[self._q.next_id()] = job.encode()
            self.local_records.enqueued(job)
        self._q.notify()

    async def publish_raw(self, data: bytes) -> str:
        """Append raw bytes as a message (for tests of malformed input)."""
        entry_id = self._q.next_id()
        self._q.waiting[entry_id] = data
        self._q.notify()
        return entry_id

    def _record(self, name: str) -> str | None:
        entry = self._q.key_records.get(name)
        if entry is None or entry[1] <= time.monotonic():
            self._q.key_records.pop(name, None)
            return None
        return entry[0]

    async def publish_unique(self, job: Job, ttl: float, run_at: float | None) -> tuple[str, bool]:
        assert job.key is not None
        existing = self._record(f"key:{job.key}") or self._record(f"done:{job.key}")
        if existing is not None:
            return existing, True
        self._q.key_records[f"key:{job.key}"] = (job.id, time.monotonic() + ttl)
        if run_at is not None:
            await self.schedule([job], run_at)
        else:
            await self.publish([job])
        return job.id, False

    async def is_completed(self, job: Job) -> bool:
        return completion_key(job) is not None and self._record(f"done:{job.key}") is not None

    async def schedule(self, jobs: Sequence[Job], run_at: float) -> None:
        for job in jobs:
            heapq.heappush(self._q.delayed, (run_at, next(self._q.ids), job.encode()))
            self.local_records.enqueued(job, run_at)
        self._q.notify()

    async def fetch(self, count: int, block: float) -> list[Delivery]:
        await self.connect()
        q = self._q
        if not q.waiting and block > 0:
            assert q.changed is not None
            q.changed.clear()
            try:
                async with asyncio.timeout(block):
                    while not q.waiting:
                        await q.changed.wait()
                        q.changed.clear()
            except TimeoutError:
                return []
        out: list[Delivery] = []
        now = time.monotonic()
        share = q.waiting.mixed and self.share_fetch()  # the highest level first, or a share
        for entry_id, data, level in q.waiting.take(count, share):
            q.pending[entry_id] = _Pending(data, self.consumer, now, 1)
            out.append(Delivery(id=entry_id, data=data, level=level))
        return out

    async def reclaim(
        self, count: int, lease_ttl: Callable[[Job | None], float], min_idle: float
    ) -> list[Delivery]:
        out: list[Delivery] = []
        now = time.monotonic()
        for entry_id, p in self._q.pending.items():
            if len(out) >= count:
                break
            idle = now - p.since
            if idle < min_idle:
                continue
            try:
                job: Job | None = Job.decode(p.data)
            except Exception:
                job = None
            if idle < lease_ttl(job):
                continue
            if job is not None and self._q.leases.owner(self.job_lease_key(job)) is not None:
                continue  # its holder still has the lease: never robbed
            p.consumer, p.since, p.delivered = self.consumer, now, p.delivered + 1
            out.append(Delivery(id=entry_id, data=p.data, delivery_count=p.delivered))
        return out

    async def give_back_unstarted(self, running: set[str]) -> int:
        mine = [
            entry_id
            for entry_id, p in self._q.pending.items()
            if p.consumer == self.consumer and entry_id not in running
        ]
        for entry_id in mine:
            await self.requeue(Delivery(entry_id, self._q.pending[entry_id].data), None)
        return len(mine)

    async def promote_due(self) -> float | None:
        q = self._q
        now = time.time()
        moved = False
        while q.delayed and q.delayed[0][0] <= now:
            _, _, data = heapq.heappop(q.delayed)
            q.waiting[q.next_id()] = data
            moved = True
        if moved:
            q.notify()
        return max(0.0, q.delayed[0][0] - now) if q.delayed else None

    def lease_backend(self) -> LeaseBackend:
        return self._q.leases

    async def keep_alive(self, delivery: Delivery) -> bool:
        p = self._q.pending.get(delivery.id)
        if p is None or p.consumer != self.consumer:
            return False
        p.since = time.monotonic()
        return True

    def _settle(self, delivery: Delivery, lease: Lease | None) -> bool:
        """The shared first half of every settle step: refuse if another holder owns it or
        has already settled it. Without a held lease (it expired, or none was used) the entry
        must still be pending to this consumer: another may have claimed it to run again."""
        p = self._q.pending.get(delivery.id)
        if p is None:
            return False
        owner = self._q.leases.owner(lease.key) if lease is not None else None
        if owner is not None and lease is not None and owner != lease.token:
            return False
        if owner is None and p.consumer != self.consumer:
            return False
        if owner is not None and lease is not None:
            self._q.leases._held.pop(lease.key, None)
        self._q.pending.pop(delivery.id, None)
        return True

    async def ack(
        self,
        delivery: Delivery,
        job: Job | None,
        lease: Lease | None,
        record_ttl: float = 0.0,
        finish: Finish | None = None,
    ) -> bool:
        if not self._settle(delivery, lease):
            return False
        if job is not None:
            if completion_key(job) is not None and record_ttl > 0:
                self._q.key_records[f"done:{job.key}"] = (job.id, time.monotonic() + record_ttl)
            end = finish or Finish()
            fields = end.fields(self.consumer, time.time())
            self.local_records.finish(job, end.state, fields, end.keep_for)
        self._q.bump("processed")
        return True

    async def retry(
        self,
        delivery: Delivery,
        job: Job,
        run_at: float,
        lease: Lease | None,
        failure: Failure | None = None,
    ) -> bool:
        if not self._settle(delivery, lease):
            return False
        heapq.heappush(self._q.delayed, (run_at, next(self._q.ids), job.encode()))
        self.local_records.retrying(job, run_at, failure_fields(failure) if failure else {})
        self._q.bump("retried")
        self._q.notify()
        return True

    async def defer(self, delivery: Delivery, job: Job, run_at: float, lease: Lease | None) -> bool:
        if not self._settle(delivery, lease):
            return False
        heapq.heappush(self._q.delayed, (run_at, next(self._q.ids), job.encode()))
        self.local_records.deferred(job, run_at)
        self._q.bump("deferred")
        self._q.notify()
        return True

    def limited_lease_backend(
        self, job: Job, limits: Limits, delivery: Delivery | None = None
    ) -> LeaseBackend:
        q = self._q
        return LimitedStart(self.local_start(job, delivery), q.limiter, limits, q.leases.owner)

    async def dead_letter(
        self,
        delivery: Delivery,
        job: Job | None,
        failure: Failure,
        attempts: int,
        lease: Lease | None,
        keep_for: float = DEFAULT_KEEP_FOR,
    ) -> str | None:
        if not self._settle(delivery, lease):
            return None
        entry_id = self._q.next_id()
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
        if job is not None:
            fields = Finish(failure=failure).fields(failure.worker or self.consumer, time.time())
            self.local_records.finish(job, "dead", {**fields, "dlq_entry": entry_id}, keep_for)
        self._q.bump("dead")
        while self.dlq_limit > 0 and len(self._q.dlq) > self.dlq_limit:
            self._q.dlq.popitem(last=False)
            self._q.bump("dlq_trimmed")
        return entry_id

    async def requeue(
        self, delivery: Delivery, lease: Lease | None, job: Job | None = None
    ) -> bool:
        p = self._q.pending.get(delivery.id)
        if p is None or p.consumer != self.consumer:
            return False
        self._settle(delivery, lease)
        if job is not None:
            self.local_records.requeued(job.id)
        self._q.waiting[self._q.next_id()] = delivery.data
        self._q.notify()
        return True

    async def depth(self) -> QueueDepth:
        q = self._q
        return QueueDepth(len(q.waiting), len(q.pending), len(q.delayed), len(q.dlq))

    async def stats(self) -> dict[str, int]:
        return dict(self._q.stats)

    async def publish_heartbeat(self, worker: str, data: dict[str, Any], ttl: float) -> None:
        await super().publish_heartbeat(worker, data, ttl)
        await self.sample_depth(time.time())  # LocalViews: one sample per bucket

    async def dlq_list(self, count: int = 100, after: str | None = None) -> list[DeadJob]:
        items = list(self._q.dlq.values())
        if after is not None:
            keys = list(self._q.dlq)
            items = items[keys.index(after) + 1 :] if after in self._q.dlq else []
        return items[:count]

    async def dlq_get(self, entry_id: str) -> DeadJob | None:
        return self._q.dlq.get(entry_id)

    async def dlq_replay(self, entries: Sequence[tuple[str, Job]]) -> int:
        n = 0
        for entry_id, job in entries:
            if self._q.dlq.pop(entry_id, None) is not None:
                self._q.waiting[self._q.next_id()] = job.encode()
                self.local_records.replayed(job)
                n += 1
        self._q.notify()
        return n

    async def dlq_delete(self, entry_ids: Sequence[str]) -> int:
        return sum(self._q.dlq.pop(i, None) is not None for i in entry_ids)
