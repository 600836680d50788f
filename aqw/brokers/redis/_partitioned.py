"""A queue spread over several Redis streams: ``PartitionedBroker`` (docs/concepts/partitions.md).

A stream lives in one hash slot, so a queue on one stream is bound to one Redis node. A
partitioned queue is P whole queue layouts under the tags ``{queue:0}`` .. ``{queue:P-1}``,
each a ``RedisBroker``, so Redis Cluster spreads them over its masters.

- **Producing**: a job goes to its route's partition or the next in turn
  (``_partitions.py``) and its id names it (``<id>~p<N>``), so a lookup reads one partition;
  an id naming none (a ``Job`` built by hand) goes where its key, else its id, hashes to.
- **Consuming**: every partition, fairly (``_partition_fetch.py``); a delivery is settled in
  its partition, which its id names too.
- **Parts**: job records in the partition the id names, the depth history summed and the
  delayed page merged, debounce in the key's partition (``_partition_parts.py``);
  heartbeats, schedule marks, limits and resource locks (``ctx.lock``) are partition 0's.

P is part of the queue's layout: change it only on an empty queue.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any, TypeVar

from redis.asyncio import Redis

from ..._ids import new_job_id
from ..._redis.batch import CommandBatcher
from ..._redis.client import make_client
from ..._redis.cluster import gather_on
from ..._redis.keys import queue_fence_of
from ..._redis.lease import RedisLeaseBackend
from ...errors import ConfigError
from ...flow import Limits
from ...job import Job
from ...lease import Lease, LeaseBackend
from ..base import Broker, check_partitions
from ..messages import DeadJob, Delivery, Failure, Finish, QueueDepth, total_counters
from ._broker import RedisBroker
from ._cancels import listen_cancels
from ._control import RedisQueueControl
from ._partition_control import PartitionedControl
from ._partition_fetch import PartitionReader
from ._partition_parts import (
    PartitionedDebounce,
    PartitionedHistory,
    PartitionedRecords,
    by_partition,
    find_dead,
    merged_dlq,
)
from ._partitions import Turns, named, partition_of_route, split_name
from ._server import RedisServer

__all__ = ["PartitionedBroker", "spread"]

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
    transient_errors = RedisBroker.transient_errors
    routes_jobs = True

    def __init__(
        self,
        client: Redis | str,
        queue: str = "default",
        partitions: int = 2,
        *,
        dlq_limit: int = 100_000,
    ) -> None:
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
        self.home = home = self.parts[0]
        super().__init__(
            queue,
            records=PartitionedRecords(self.client, self.parts),
            status=home.status,
            marks=home.marks,
            history=PartitionedHistory(self.client, self.parts),
            debounce=PartitionedDebounce(self.part_of),
            flow_limits=home.flow_limits,  # each partition's job_start.lua; a route: one
            server=RedisServer(self.client, [part.keys for part in self.parts]),
            control=PartitionedControl([_control_of(part) for part in self.parts]),
            rates=home.rates,  # the workers' counts, whatever the partition
        )
        batcher = CommandBatcher(self.client)
        self._leases = RedisLeaseBackend(batcher, fence_key=queue_fence_of)
        self._turns = Turns(self.partitions)
        self.reader = PartitionReader(self.parts, self._turns.take())

    def describe(self) -> str:
        return f"{self.home.describe()} partitions={self.partitions}"

    # -- where things are -------------------------------------------------------------------

    def sibling(self, queue: str) -> PartitionedBroker:
        """Queue ``queue`` over as many partitions, on this broker's client."""
        return PartitionedBroker(self.client, queue, self.partitions, dlq_limit=self.dlq_limit)

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

    # -- lifecycle -------------------------------------------------------------------------

    async def connect(self) -> None:
        await self._each(lambda part: part.connect())

    @property
    def pushes_cancels(self) -> bool:  # type: ignore[override]
        return isinstance(self.client, Redis)

    async def watch_cancels(self, on_cancel: Callable[[str], None]) -> None:
        """The cancels of every partition, on one subscribed connection (``_cancels.py``)."""
        if isinstance(self.client, Redis):
            keys = [part.keys for part in self.parts]
            await listen_cancels(self.client, keys, on_cancel, self.transient_errors)

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

    # -- consuming -------------------------------------------------------------------------

    async def fetch(self, count: int, block: float, share: float = 0.0) -> list[Delivery]:
        """Up to ``count`` deliveries, a fair share from each partition, without waiting;
        only when every partition is empty, wait up to ``block`` seconds for the first."""
        return await self.reader.fetch(self.consumer, count, block, share)

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

    # -- settling: the delivery's own partition ---------------------------------------------

    def _ack(
        self,
        delivery: Delivery,
        job: Job | None,
        lease: Lease | None,
        finish: Finish,
        record_ttl: float,
    ) -> Coroutine[Any, Any, bool]:
        p, own = self._unwrap(delivery)
        return self.parts[p].ack(own, job, lease, record_ttl, finish)

    def _retry(
        self,
        delivery: Delivery,
        job: Job,
        run_at: float,
        lease: Lease | None,
        failure: Failure | None,
    ) -> Coroutine[Any, Any, bool]:
        p, own = self._unwrap(delivery)
        return self.parts[p].retry(own, job, run_at, lease, failure)

    async def _dead_letter(
        self,
        delivery: Delivery,
        job: Job | None,
        failure: Failure,
        attempts: int,
        lease: Lease | None,
        keep_for: float,
    ) -> str | None:
        p, own = self._unwrap(delivery)
        entry = await self.parts[p].dead_letter(own, job, failure, attempts, lease, keep_for)
        return None if entry is None else named(entry, p)

    def _give_back(
        self, delivery: Delivery, lease: Lease | None, job: Job | None
    ) -> Coroutine[Any, Any, bool]:
        p, own = self._unwrap(delivery)
        return self.parts[p].give_back(own, lease, job)

    def _defer(
        self, delivery: Delivery, job: Job, run_at: float, lease: Lease | None
    ) -> Coroutine[Any, Any, bool]:
        p, own = self._unwrap(delivery)
        return self.parts[p].defer(own, job, run_at, lease)

    async def is_completed(self, job: Job) -> bool:
        return await self.part_of(job).is_completed(job)

    def job_lease_backend(
        self, job: Job, limits: Limits | None = None, delivery: Delivery | None = None
    ) -> LeaseBackend:
        own = None if delivery is None else self._unwrap(delivery)[1]
        return self.part_of(job).job_lease_backend(job, limits, own)

    # -- inspection: summed or merged over the partitions -------------------------------

    async def partition_depths(self) -> list[QueueDepth]:
        """Each partition's depth, in partition order."""
        return await self._each(lambda part: part.depth())

    async def depth(self) -> QueueDepth:
        return QueueDepth.total(await self.partition_depths())

    async def stats(self) -> dict[str, int]:
        return total_counters(await self._each(lambda part: part.stats()))

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


def spread(broker: Broker, partitions: int) -> Broker:
    """``broker`` (given as an object) spread over ``partitions``: a ``RedisBroker`` becomes
    a ``PartitionedBroker`` on its client; a ``PartitionedBroker`` must have that many; 1
    keeps any broker as it is; anything else is a ConfigError."""
    if isinstance(broker, PartitionedBroker):
        if broker.partitions != partitions:
            raise ConfigError(
                f"partitions={partitions}, but the broker given has {broker.partitions}"
            )
        return broker
    if partitions == 1:
        return broker
    if isinstance(broker, RedisBroker):
        return PartitionedBroker(
            broker.client, broker.queue, partitions, dlq_limit=broker.dlq_limit
        )
    raise ConfigError(
        f"partitions={partitions}: only a Redis queue is partitioned, not a {type(broker).__name__}"
    )


def _control_of(part: RedisBroker) -> RedisQueueControl:
    control = part.control
    assert isinstance(control, RedisQueueControl)  # a RedisBroker's own
    return control
