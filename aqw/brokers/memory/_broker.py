"""The in-process broker: the embedded default, and a test double with the same semantics
as the Redis Streams broker (pending entries, reclaim after idle, delayed set, capped DLQ,
leases with fencing tokens, job records). Brokers with the same name in one process share
one queue (``_queue.py``) and its parts, all in-process (``aqw.brokers.local``)."""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable, Sequence

from ...flow import Limits, completion_key
from ...job import Job
from ...lease import Lease, LeaseBackend
from ..base import Broker
from ..local import LimitedStart, LocalStartGuard, ShareCredit, still_ours
from ..local import MemoryLeaseBackend as MemoryLeaseBackend  # re-exported
from ..local.clock import clock
from ..messages import DeadJob, Delivery, Failure, Finish, QueueDepth
from ..parts import StartLimits
from ._queue import Pending, memory_queue

#: Rate limits and caps hold for the workers of this process: the whole queue is here.
LIMITS = StartLimits(shared=False)


class MemoryBroker(Broker):
    """An in-process queue. ``MemoryBroker("q")`` instances in one process share queue ``q``."""

    system = "memory"
    in_process = True

    def __init__(self, queue: str = "default", *, dlq_limit: int = 100_000) -> None:
        q = memory_queue(queue)
        super().__init__(
            queue,
            records=q.records,
            status=q.status,
            marks=q.marks,
            history=q.history,
            debounce=q.debounce,
            flow_limits=LIMITS,
            batches=q.batches,
            control=q.control,
            rates=q.rates,
        )
        self.dlq_limit = dlq_limit
        self._q = q
        self._share = ShareCredit()
        self.fair_shares = q.fair
        self.run_limits = q.run_limits
        self.progress = q.progress

    def describe(self) -> str:
        return f"memory://{self.queue} (in-process only)"

    def sibling(self, queue: str) -> MemoryBroker:
        return MemoryBroker(queue, dlq_limit=self.dlq_limit)

    async def connect(self) -> None:
        return None

    async def close(self) -> None:
        return None

    pushes_cancels = True

    async def watch_cancels(self, on_cancel: Callable[[str], None]) -> None:
        """Told directly, in the process, by the queue's job records."""
        await self._q.records.watch_cancels(on_cancel)

    async def publish(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            self._q.waiting[self._q.next_id()] = job.encode()
            self._q.records.enqueued(job)
        self._q.notify()

    async def publish_raw(self, data: bytes) -> str:
        """Append raw bytes as a message (for tests of malformed input)."""
        entry_id = self._q.next_id()
        self._q.waiting[entry_id] = data
        self._q.notify()
        return entry_id

    def _record(self, name: str) -> str | None:
        entry = self._q.key_records.get(name)
        if entry is None or entry[1] <= clock.monotonic():
            self._q.key_records.pop(name, None)
            return None
        return entry[0]

    async def publish_unique(self, job: Job, ttl: float, run_at: float | None) -> tuple[str, bool]:
        assert job.key is not None
        existing = self._record(f"key:{job.key}") or self._record(f"done:{job.key}")
        if existing is not None:
            return existing, True
        self._q.key_records[f"key:{job.key}"] = (job.id, clock.monotonic() + ttl)
        if run_at is not None:
            await self.schedule([job], run_at)
        else:
            await self.publish([job])
        return job.id, False

    async def is_completed(self, job: Job) -> bool:
        return completion_key(job) is not None and self._record(f"done:{job.key}") is not None

    async def schedule(self, jobs: Sequence[Job], run_at: float) -> None:
        run_at += clock.offset()  # a time.time() reading: onto the queue's clock
        for job in jobs:
            heapq.heappush(self._q.delayed, (run_at, next(self._q.ids), job.encode()))
            self._q.records.enqueued(job, run_at)
        self._q.notify()

    async def fetch(self, count: int, block: float, share: float = 0.0) -> list[Delivery]:
        q = self._q
        fair = q.fair.levels
        if not q.waiting and block > 0 and not (fair and len(q.fair)):
            loop = asyncio.get_running_loop()
            deadline = loop.time() + block
            while not q.waiting and not (fair and len(q.fair)):
                if not await q.changed.wait(deadline - loop.time()):
                    return []
        out: list[Delivery] = []
        now = clock.monotonic()
        if fair:  # jobs with a fairness key: picked into the FIFOs as this fetch wants them
            q.fair.fill(q.waiting, count)
        lowest = q.waiting.mixed and self._share.turn(share)  # the highest level first
        for entry_id, data, level in q.waiting.take(count, lowest):
            q.pending[entry_id] = Pending(data, self.consumer, now, 1)
            out.append(Delivery(id=entry_id, data=data, level=level))
        return out

    async def reclaim(
        self, count: int, lease_ttl: Callable[[Job | None], float], min_idle: float
    ) -> list[Delivery]:
        out: list[Delivery] = []
        now = clock.monotonic()
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
            await self.give_back(Delivery(entry_id, self._q.pending[entry_id].data), None)
        return len(mine)

    async def promote_due(self) -> float | None:
        q = self._q
        now = clock.time()
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

    def job_lease_backend(
        self, job: Job, limits: Limits | None = None, delivery: Delivery | None = None
    ) -> LeaseBackend:
        q = self._q
        start = LocalStartGuard(q.leases, q.records, job, self.consumer, still_ours(self, delivery))
        return start if limits is None else LimitedStart(start, q.limiter, limits, q.leases.owner)

    async def keep_alive(self, delivery: Delivery) -> bool:
        p = self._q.pending.get(delivery.id)
        if p is None or p.consumer != self.consumer:
            return False
        p.since = clock.monotonic()
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
            self._q.leases.drop(lease.key)
        self._q.pending.pop(delivery.id, None)
        return True

    # The settle steps: the base's public ones keep the job records (``LocalJobRecords``).

    async def _ack(
        self,
        delivery: Delivery,
        job: Job | None,
        lease: Lease | None,
        finish: Finish,
        record_ttl: float,
    ) -> bool:
        if not self._settle(delivery, lease):
            return False
        if job is not None and completion_key(job) is not None and record_ttl > 0:
            self._q.key_records[f"done:{job.key}"] = (job.id, clock.monotonic() + record_ttl)
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
        if not self._settle(delivery, lease):
            return False
        run_at += clock.offset()
        heapq.heappush(self._q.delayed, (run_at, next(self._q.ids), job.encode()))
        self._q.bump("retried")
        self._q.notify()
        return True

    async def _defer(
        self, delivery: Delivery, job: Job, run_at: float, lease: Lease | None
    ) -> bool:
        if not self._settle(delivery, lease):
            return False
        run_at += clock.offset()
        heapq.heappush(self._q.delayed, (run_at, next(self._q.ids), job.encode()))
        self._q.bump("deferred")
        self._q.notify()
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
        self._q.bump("dead")
        while self.dlq_limit > 0 and len(self._q.dlq) > self.dlq_limit:
            self._q.dlq.popitem(last=False)
            self._q.bump("dlq_trimmed")
        return entry_id

    async def _give_back(self, delivery: Delivery, lease: Lease | None, job: Job | None) -> bool:
        p = self._q.pending.get(delivery.id)
        if p is None or p.consumer != self.consumer:
            return False
        self._settle(delivery, lease)
        self._q.waiting[self._q.next_id()] = delivery.data
        self._q.notify()
        return True

    async def depth(self) -> QueueDepth:
        return await self._q.depth()

    async def stats(self) -> dict[str, int]:
        return dict(self._q.stats)

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
                self._q.records.replayed(job)
                n += 1
        self._q.notify()
        return n

    async def dlq_delete(self, entry_ids: Sequence[str]) -> int:
        return sum(self._q.dlq.pop(i, None) is not None for i in entry_ids)
