"""A queue spread over several Redis streams: ``PartitionedBroker`` (docs/concepts/partitions.md).

A stream lives in one hash slot, so a queue on one stream is bound to one Redis node. A
partitioned queue is P whole queue layouts under the tags ``{queue:0}`` .. ``{queue:P-1}``,
each a ``RedisBroker``, so Redis Cluster spreads them over its masters.

- **Producing**: a job goes to its route's partition or the next in turn
  (``_partitions.py``) and its id names it (``<id>~p<N>``), so a lookup reads one partition;
  an id naming none (a ``Job`` built by hand) goes where its key, else its id, hashes to.
- **Consuming**: every partition, fairly (``_partition_fetch.py``); a delivery is settled in
  its partition, which its id names too.
- **Reading**: summed or merged over the partitions (``_partition_reads.py``). Heartbeats,
  schedule marks and resource locks (``ctx.lock``) live in partition 0.

P is part of the queue's layout: change it only on an empty queue.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

from redis.asyncio import Redis

from .._ids import new_job_id
from .._redis.client import make_client
from .._redis.cluster import gather_on
from .._redis.keys import queue_fence_of
from .._redis.lease import RedisLeaseBackend
from ..job import Job
from ..lease import Lease, LeaseBackend
from ..record import DEFAULT_KEEP_FOR, JobInfo
from ._flow import Limits
from ._local_records import CancelOutcome
from ._partition_fetch import PartitionReader
from ._partition_reads import (
    by_partition,
    find_dead,
    holder_of,
    merged_delayed,
    merged_dlq,
    summed_history,
)
from ._partitions import Turns, check_partitions, named, partition_of_route, split_name
from ._schedule_marks import ScheduleMark
from ._views import DelayedJob, DepthSample
from .base import Broker, DeadJob, Delivery, Failure, Finish, QueueDepth
from .messages import total_counters
from .redis import RedisBroker

__all__ = ["PartitionedBroker"]

T = TypeVar("T")


class PartitionedBroker(Broker):
    """A queue on Redis spread over ``partitions`` streams, each in a hash slot of its own.

    Args:
        client: a ``redis.asyncio.Redis`` or ``RedisCluster`` client, or a ``redis://`` /
            ``redis+cluster://`` URL.
        queue: the queue name.
        partitions: how many partitions (1 to 1024); pick several per cluster master.
        dlq_limit: most entries each partition's dead-letter stream keeps.

    Also by URL: ``redis+cluster://host:port/?queue=q&partitions=6`` (or
    ``App(..., partitions=6)``).
    """

    system = RedisBroker.system
    enforces_limits = True  # each partition's job_start.lua; a route keeps a key in one
    transient_errors = RedisBroker.transient_errors

    def __init__(
        self,
        client: Redis | str,
        queue: str = "default",
        partitions: int = 2,
        *,
        dlq_limit: int = 100_000,
    ) -> None:
        super().__init__(queue)
        self.partitions = check_partitions(partitions)
        self.url = client if isinstance(client, str) else None
        self.client: Redis = make_client(client) if isinstance(client, str) else client
        self._owns_client = isinstance(client, str)
        self.dlq_limit = dlq_limit
        self.parts = tuple(
            RedisBroker(self.client, queue, dlq_limit=dlq_limit, partition=i)
            for i in range(self.partitions)
        )
        #: Partition 0: worker heartbeats, schedule marks, resource locks.
        self.home = self.parts[0]
        self._leases = RedisLeaseBackend(self.home.batcher, fence_key=queue_fence_of)
        self._turns = Turns(self.partitions)
        self.reader = PartitionReader(self.parts, self._turns.take())

    def describe(self) -> str:
        return f"{self.home.describe()} partitions={self.partitions}"

    # -- where things are -------------------------------------------------------------------

    def job_id_for(self, route: str | None) -> str:
        """A new job id naming the partition of ``route`` (None: the next in turn)."""
        p = self._turns.take() if route is None else partition_of_route(route, self.partitions)
        return named(new_job_id(), p)

    def partition_of(self, job: Job) -> int:
        """Its id's partition, else the one its idempotency key (else its id) hashes to."""
        p = split_name(job.id, self.partitions)[1]
        return p if p is not None else partition_of_route(job.key or job.id, self.partitions)

    def part_of(self, job: Job) -> RedisBroker:
        """The partition broker of ``job``."""
        return self.parts[self.partition_of(job)]

    def _unwrap(self, delivery: Delivery) -> tuple[int, Delivery]:
        """(its partition, ``delivery`` as that partition made it: with its own entry id);
        one not of ours goes to partition 0, which refuses what it does not hold."""
        base, p = split_name(delivery.id, self.partitions)
        return (0, delivery) if p is None else (p, dataclasses.replace(delivery, id=base))

    def _by_job(self, jobs: Iterable[Job]) -> dict[int, list[Job]]:
        out: dict[int, list[Job]] = {}
        for job in jobs:
            out.setdefault(self.partition_of(job), []).append(job)
        return out

    async def _each(self, step: Callable[[RedisBroker], Awaitable[T]]) -> list[T]:
        """``step`` on every partition at once, in partition order."""
        return await gather_on(self.client, *(step(part) for part in self.parts))

    async def _holders(self, job_id: str) -> Sequence[RedisBroker]:
        """The partitions a write about ``job_id`` goes to: its own, or all for an id that
        names none (the writes act only where the job's record is)."""
        p = split_name(job_id, self.partitions)[1]
        return self.parts if p is None else (self.parts[p],)

    # -- lifecycle -------------------------------------------------------------------------

    async def connect(self) -> None:
        await self._each(lambda part: part.connect())

    async def close(self) -> None:
        await self._each(lambda part: part.close())  # their waiters; the client is ours
        if self._owns_client:
            await self.client.aclose()

    async def start_consuming(self, consumer: str) -> None:
        self.consumer = consumer
        await self._each(lambda part: part.start_consuming(consumer))

    def expect_lease_ttl(self, seconds: float) -> None:
        for part in self.parts:
            part.expect_lease_ttl(seconds)

    def set_priority_share(self, share: float) -> None:
        super().set_priority_share(share)
        for part in self.parts:
            part.set_priority_share(share)

    # -- producing -------------------------------------------------------------------------

    async def publish(self, jobs: Sequence[Job]) -> None:
        groups = self._by_job(jobs)
        await gather_on(self.client, *(self.parts[p].publish(group) for p, group in groups.items()))

    async def schedule(self, jobs: Sequence[Job], run_at: float) -> None:
        groups = self._by_job(jobs)
        await gather_on(
            self.client, *(self.parts[p].schedule(group, run_at) for p, group in groups.items())
        )

    @property
    def keyed_enqueue(self) -> bool:
        return True

    async def publish_unique(self, job: Job, ttl: float, run_at: float | None) -> tuple[str, bool]:
        return await self.part_of(job).publish_unique(job, ttl, run_at)

    async def publish_debounced(
        self, job: Job, debounce: float, debounce_max: float | None
    ) -> tuple[str, bool]:
        return await self.part_of(job).publish_debounced(job, debounce, debounce_max)

    # -- consuming -------------------------------------------------------------------------

    async def fetch(self, count: int, block: float) -> list[Delivery]:
        """Up to ``count`` deliveries, a fair share from each partition, without waiting;
        only when every partition is empty, wait up to ``block`` seconds for the first."""
        return await self.reader.fetch(self.consumer, count, block)

    async def reclaim(
        self, count: int, lease_ttl: Callable[[Job | None], float], min_idle: float
    ) -> list[Delivery]:
        return await self.reader.reclaim(count, lease_ttl, min_idle)

    async def give_back_unstarted(self, running: set[str]) -> int:
        own: list[set[str]] = [set() for _ in self.parts]
        for delivery_id in running:
            base, p = split_name(delivery_id, self.partitions)
            if p is not None:
                own[p].add(base)
        given = await gather_on(
            self.client, *(part.give_back_unstarted(own[p]) for p, part in enumerate(self.parts))
        )
        return sum(given)

    async def promote_due(self) -> float | None:
        waits = [w for w in await self._each(lambda part: part.promote_due()) if w is not None]
        return min(waits) if waits else None

    def lease_backend(self) -> LeaseBackend:
        """Leases on any key of the queue (resource locks, the scheduler's and the monitor's
        ``aqw:{q}:monitor``), each counted by the fencing counter of its own tag's slot."""
        return self._leases

    def job_lease_key(self, job: Job) -> str:
        return self.part_of(job).job_lease_key(job)

    def lock_key(self, name: str) -> str:
        return self.home.lock_key(name)

    async def keep_alive(self, delivery: Delivery) -> bool:
        p, own = self._unwrap(delivery)
        return await self.parts[p].keep_alive(own)

    # -- settling: the delivery's own partition --------------------------------------------

    async def ack(
        self,
        delivery: Delivery,
        job: Job | None,
        lease: Lease | None,
        record_ttl: float = 0.0,
        finish: Finish | None = None,
    ) -> bool:
        p, own = self._unwrap(delivery)
        return await self.parts[p].ack(own, job, lease, record_ttl, finish)

    async def retry(
        self,
        delivery: Delivery,
        job: Job,
        run_at: float,
        lease: Lease | None,
        failure: Failure | None = None,
    ) -> bool:
        p, own = self._unwrap(delivery)
        return await self.parts[p].retry(own, job, run_at, lease, failure)

    async def dead_letter(
        self,
        delivery: Delivery,
        job: Job | None,
        failure: Failure,
        attempts: int,
        lease: Lease | None,
        keep_for: float = DEFAULT_KEEP_FOR,
    ) -> str | None:
        p, own = self._unwrap(delivery)
        entry = await self.parts[p].dead_letter(own, job, failure, attempts, lease, keep_for)
        return None if entry is None else named(entry, p)

    async def requeue(
        self, delivery: Delivery, lease: Lease | None, job: Job | None = None
    ) -> bool:
        p, own = self._unwrap(delivery)
        return await self.parts[p].requeue(own, lease, job)

    async def defer(self, delivery: Delivery, job: Job, run_at: float, lease: Lease | None) -> bool:
        p, own = self._unwrap(delivery)
        return await self.parts[p].defer(own, job, run_at, lease)

    async def is_completed(self, job: Job) -> bool:
        return await self.part_of(job).is_completed(job)

    def job_lease_backend(self, job: Job, delivery: Delivery | None = None) -> LeaseBackend:
        return self.part_of(job).job_lease_backend(job, delivery and self._unwrap(delivery)[1])

    def limited_lease_backend(
        self, job: Job, limits: Limits, delivery: Delivery | None = None
    ) -> LeaseBackend:
        own = delivery and self._unwrap(delivery)[1]
        return self.part_of(job).limited_lease_backend(job, limits, own)

    # -- job records: the partition the id names -------------------------------------------

    def _info(self, holder: RedisBroker, info: JobInfo) -> JobInfo:
        """``info`` as read from ``holder``, its DLQ entry's id naming the partition."""
        if not info.dlq_entry:
            return info
        return info.model_copy(
            update={"dlq_entry": named(info.dlq_entry, self.parts.index(holder))}
        )

    async def record(self, job_id: str) -> JobInfo | None:
        holder = await holder_of(self.parts, job_id)
        info = None if holder is None else await holder.record(job_id)
        return None if info is None or holder is None else self._info(holder, info)

    async def cancel(self, job_id: str, keep_for: float = DEFAULT_KEEP_FOR) -> CancelOutcome:
        holder = await holder_of(self.parts, job_id)
        return "unknown" if holder is None else await holder.cancel(job_id, keep_for)

    async def cancel_requested(self, job_id: str) -> bool:
        parts = await self._holders(job_id)
        return any(await gather_on(self.client, *(p.cancel_requested(job_id) for p in parts)))

    async def wait_finished(self, job_id: str, timeout: float | None) -> JobInfo:
        holder = await holder_of(self.parts, job_id)
        if holder is None:  # its own partition says UnknownJob
            holder = self.parts[partition_of_route(job_id, self.partitions)]
        return self._info(holder, await holder.wait_finished(job_id, timeout))

    async def set_job_state(self, job_id: str, state: dict[str, str], ttl: float) -> None:
        parts = await self._holders(job_id)
        await gather_on(self.client, *(p.set_job_state(job_id, state, ttl) for p in parts))

    async def clear_job_state(self, job_id: str) -> None:
        parts = await self._holders(job_id)
        await gather_on(self.client, *(p.clear_job_state(job_id) for p in parts))

    async def job_state(self, job_id: str) -> dict[str, str] | None:
        parts = await self._holders(job_id)
        states = await gather_on(self.client, *(p.job_state(job_id) for p in parts))
        return next((s for s in states if s is not None), None)

    async def job_states(self, limit: int = 1000) -> list[dict[str, str]]:
        each = await self._each(lambda part: part.job_states(limit))
        return [state for states in each for state in states][:limit]

    # -- partition 0's: heartbeats, schedule marks -----------------------------------------

    async def publish_heartbeat(self, worker: str, data: dict[str, Any], ttl: float) -> None:
        await self.home.publish_heartbeat(worker, data, ttl)  # samples partition 0's depth
        at = time.time()
        await gather_on(self.client, *(part.sample_depth(at) for part in self.parts[1:]))

    async def heartbeats(self) -> list[dict[str, Any]]:
        return await self.home.heartbeats()

    async def remove_heartbeat(self, worker: str) -> None:
        await self.home.remove_heartbeat(worker)

    async def schedule_marks(self) -> dict[str, ScheduleMark]:
        return await self.home.schedule_marks()

    async def set_schedule_mark(self, task: str, mark: ScheduleMark) -> None:
        await self.home.set_schedule_mark(task, mark)

    # -- inspection: summed or merged over the partitions (``_partition_reads.py``) --------

    async def depths(self) -> list[QueueDepth]:
        """Each partition's depth, in partition order."""
        return await self._each(lambda part: part.depth())

    async def depth(self) -> QueueDepth:
        return QueueDepth.total(await self.depths())

    async def stats(self) -> dict[str, int]:
        return total_counters(await self._each(lambda part: part.stats()))

    async def sample_depth(self, at: float) -> None:
        await self._each(lambda part: part.sample_depth(at))

    async def depth_history(self, since: float) -> list[DepthSample]:
        return summed_history(await self._each(lambda part: part.depth_history(since)))

    async def delayed_page(self, start: int, count: int) -> list[DelayedJob]:
        pages = await self._each(lambda part: part.delayed_page(0, start + count))
        return merged_delayed(pages, start, count)

    async def dlq_list(self, count: int = 100, after: str | None = None) -> list[DeadJob]:
        """Oldest first over every partition (by entry id, then partition)."""
        return await merged_dlq(self.parts, count, after)

    async def dlq_get(self, entry_id: str) -> DeadJob | None:
        return await find_dead(self.parts, entry_id)

    async def dlq_replay(self, entries: Sequence[tuple[str, Job]]) -> int:
        groups: dict[int, list[tuple[str, Job]]] = {}
        for entry_id, job in entries:
            base, p = split_name(entry_id, self.partitions)
            groups.setdefault(self.partition_of(job) if p is None else p, []).append((base, job))
        replayed = await gather_on(
            self.client, *(self.parts[p].dlq_replay(group) for p, group in groups.items())
        )
        return sum(replayed)

    async def dlq_delete(self, entry_ids: Sequence[str]) -> int:
        deleted = 0
        for p, bases in by_partition(entry_ids, self.partitions).items():
            parts = self.parts if p is None else (self.parts[p],)
            deleted += sum(
                await gather_on(self.client, *(part.dlq_delete(bases) for part in parts))
            )
        return deleted
