"""Redis Streams broker: a consumer group per queue, manual acks, recovery per job's lease.

Layout (all keys share the ``{queue}`` hash tag): ``aqw:{q}:stream`` holds unfinished jobs
(entries are deleted when settled, so it stays bounded), ``aqw:{q}:delayed`` (ZSET by due
time), ``aqw:{q}:dlq`` (capped stream), ``aqw:{q}:fence`` (fencing counter),
``aqw:{q}:lease:<job id>``, ``aqw:{q}:stats``, and per job its record ``aqw:{q}:job:<id>``
(``aqw/record.py``; written by the same scripts that move the job, ``_redis_jobs.py``), the
``aqw:{q}:running`` index of running jobs, ``aqw:{q}:schedule`` (the periodic tasks' marks,
``_redis_schedule.py``) and, while someone waits for a job to end, ``aqw:{q}:waiters:<id>``
and the waiting processes' inboxes (``aqw/_redis/waiters.py``). A priority level N > 0 has
its own ``aqw:{q}:stream:pN`` and ``aqw:{q}:delayed:pN``, listed in ``aqw:{q}:levels``
(``_redis_levels.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError, ResponseError, TimeoutError

from .._redis import scripts as _scripts
from .._redis.batch import CommandBatcher
from .._redis.client import MAX_BLOCK, describe_broker, make_client, split_queue
from .._redis.cluster import CLUSTER_TRANSIENT_ERRORS
from .._redis.connections import open_spares
from .._redis.keys import GROUP, QueueKeys
from .._redis.lease import RedisLeaseBackend
from .._redis.waiters import JobWaiters
from ..job import Job
from ..lease import Lease, LeaseBackend
from ..record import DEFAULT_KEEP_FOR, JobInfo
from ._debounce import completion_key
from ._flow import Limits
from ._local_records import CancelOutcome
from ._redis_debounce import RedisDebouncedPublish
from ._redis_jobs import RedisJobs
from ._redis_levels import RedisLevels, locate
from ._redis_records import dead_job_of, text
from ._redis_schedule import RedisSchedule
from ._redis_start import RedisJobLease, defer
from ._redis_status import RedisStatus
from ._redis_views import RedisViews
from ._schedule_marks import ScheduleMark
from .base import Broker, DeadJob, Delivery, Failure, Finish, QueueDepth

__all__ = ["MAX_BLOCK", "RedisBroker", "make_client", "split_queue"]


class RedisBroker(RedisViews, RedisDebouncedPublish, Broker):
    """A queue on Redis Streams.

    Args:
        client: a ``redis.asyncio.Redis`` (or ``RedisCluster``) client, or a ``redis://``
            (``redis+cluster://``) URL.
        queue: the queue name.
        dlq_limit: most entries the dead-letter stream keeps; older ones are trimmed and
            counted in ``stats()['dlq_trimmed']``.
        partition: this broker is partition ``i`` of a partitioned queue: its keys carry
            the tag ``{queue:i}`` (``PartitionedBroker`` builds these; None: the queue's
            own ``{queue}``).
    """

    system = "redis"
    enforces_limits = True  # in job_start.lua, for every worker (``_redis_start.py``)
    describe = describe_broker  # Broker.describe: ``redis://host:port/db queue=q``
    #: redis-py's connection and timeout errors, besides the built-in ones, and a cluster's
    #: errors while slots move (``CLUSTERDOWN`` and ``TRYAGAIN`` during a failover).
    transient_errors = (
        ConnectionError,
        TimeoutError,
        *CLUSTER_TRANSIENT_ERRORS,
        *Broker.transient_errors,
    )

    def __init__(
        self,
        client: Redis | str,
        queue: str = "default",
        *,
        dlq_limit: int = 100_000,
        partition: int | None = None,
    ):
        super().__init__(queue)
        self.url = client if isinstance(client, str) else None
        self.client: Redis = make_client(client) if isinstance(client, str) else client
        self._owns_client = isinstance(client, str)
        self.keys = QueueKeys(queue, partition)
        self.dlq_limit = dlq_limit
        self.batcher = CommandBatcher(self.client)
        self.status = RedisStatus(self.client, self.batcher, self.keys)
        self._leases = RedisLeaseBackend(self.batcher, fence_key=self.keys.fence)
        self.jobs = RedisJobs(self.client, self.batcher, self.keys, self._leases, dlq_limit)
        self.waiters = JobWaiters(self.client, self.batcher, self.keys)
        self.marks = RedisSchedule(self.client, self.keys)
        self.levels = RedisLevels(self.batcher, self.keys)  # priority levels
        #: The consumer names this broker has read as (``_holder``).
        self._read_as: set[str] = set()
        self._keep_alive = _scripts.load("keep_alive")
        self._group_ready = False

    async def connect(self) -> None:
        await self.client.ping()
        await self._ensure_group()

    async def _ensure_group(self) -> None:
        try:
            await self.client.xgroup_create(self.keys.stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    async def close(self) -> None:
        await self.waiters.close()
        if self._owns_client:
            await self.client.aclose()

    # -- producing -------------------------------------------------------------------------

    # A job of a priority level > 0 announces its level (``_redis_levels.py``) the first
    # time this process uses it, in the same round trip as its enqueue.

    async def publish(self, jobs: Sequence[Job]) -> None:
        await self.levels.around(jobs, self.jobs.publish(jobs))

    async def publish_unique(self, job: Job, ttl: float, run_at: float | None) -> tuple[str, bool]:
        step = self.jobs.publish_unique(job, ttl, run_at)
        job_id, duplicate = await self.levels.around([job], step)
        return text(job_id), bool(duplicate)

    async def publish_debounced(
        self, job: Job, debounce: float, debounce_max: float | None
    ) -> tuple[str, bool]:
        step = super().publish_debounced(job, debounce, debounce_max)
        return await self.levels.around([job], step)

    async def schedule(self, jobs: Sequence[Job], run_at: float) -> None:
        await self.levels.around(jobs, self.jobs.publish(jobs, run_at))

    # -- consuming -------------------------------------------------------------------------

    async def start_consuming(self, consumer: str) -> None:
        """Also opens the connections its lease renewals go by (``open_spares``)."""
        self.consumer = consumer
        await open_spares(self.client)

    async def fetch(self, count: int, block: float) -> list[Delivery]:
        """Highest priority level first (a share from the lowest waiting one), reading the
        levels in use in the same step (``RedisLevels.fetch``); ``block`` <= 0: no wait."""
        block_ms = max(1, int(min(block, MAX_BLOCK) * 1000)) if block > 0 else 0
        share = len(self.levels.active) > 1 and self.share_fetch()
        self._read_as.add(self.consumer)
        return await self.levels.fetch(self.consumer, count, block_ms, share)

    def _holder(self, delivery: Delivery) -> str:
        """The consumer holding ``delivery`` in the group's pending list: the one this broker
        read it as (workers sharing a broker each read as their own), else its current one
        (a reclaimed delivery, or one this broker did not read: refused by the scripts)."""
        read_as = delivery.receipt
        return read_as if read_as in self._read_as else self.consumer

    async def reclaim(
        self, count: int, lease_ttl: Callable[[Job | None], float], min_idle: float
    ) -> list[Delivery]:
        """Each level's pending entries, highest level first (``RedisLevels.reclaim``)."""
        if count <= 0 or not self.consumer:
            return []
        await self.levels.refresh()
        return await self.levels.reclaim(self.consumer, count, lease_ttl, min_idle)

    async def give_back_unstarted(self, running: set[str]) -> int:
        if not self.consumer:
            return 0
        given = 0
        for level in self.levels.active:
            pending: Any = await self.client.xpending_range(
                self.keys.stream_for(level), GROUP, "-", "+", 1000, consumername=self.consumer
            )
            for entry in pending:
                entry_id = text(entry["message_id"])
                back = Delivery(entry_id, b"", level=level)
                if entry_id not in running and await self.requeue(back, None):
                    given += 1
        return given

    async def promote_due(self) -> float | None:
        await self.levels.refresh()
        moved, next_due = await self.levels.promote(int(time.time() * 1000), 500)  # each level
        if moved >= 500:
            return 0.0
        if next_due < 0:
            return None
        return max(0.0, int(next_due) / 1000 - time.time())

    def lease_backend(self) -> LeaseBackend:
        return self._leases

    def job_lease_key(self, job: Job) -> str:
        return self.keys.lease(job.id)

    def lock_key(self, name: str) -> str:
        return self.keys.lock(name)

    async def keep_alive(self, delivery: Delivery) -> bool:
        """Sent with each renewal of the job's lease: by the batcher's priority lane."""
        stream, entry_id = locate(self.keys, delivery)  # the stream of its level
        ok = await self.batcher.priority.script(
            self._keep_alive, [stream], [GROUP, self._holder(delivery), entry_id]
        )
        return bool(ok)

    # -- settling (``_redis_jobs.py``) ------------------------------------------------------

    async def ack(
        self,
        delivery: Delivery,
        job: Job | None,
        lease: Lease | None,
        record_ttl: float = 0.0,
        finish: Finish | None = None,
    ) -> bool:
        return await self.jobs.ack(self._holder(delivery), delivery, job, lease, record_ttl, finish)

    async def retry(
        self,
        delivery: Delivery,
        job: Job,
        run_at: float,
        lease: Lease | None,
        failure: Failure | None = None,
    ) -> bool:
        return await self.jobs.retry(self._holder(delivery), delivery, job, run_at, lease, failure)

    async def dead_letter(
        self,
        delivery: Delivery,
        job: Job | None,
        failure: Failure,
        attempts: int,
        lease: Lease | None,
        keep_for: float = DEFAULT_KEEP_FOR,
    ) -> str | None:
        entry = await self.jobs.dead_letter(
            self._holder(delivery), delivery, job, failure, attempts, lease, keep_for
        )
        return None if entry is None else text(entry)  # the DLQ entry's id (None: refused)

    async def requeue(
        self, delivery: Delivery, lease: Lease | None, job: Job | None = None
    ) -> bool:
        return await self.jobs.requeue(self._holder(delivery), delivery, lease, job)

    async def defer(self, delivery: Delivery, job: Job, run_at: float, lease: Lease | None) -> bool:
        return await defer(self.jobs, self._holder(delivery), delivery, job, run_at, lease)

    async def is_completed(self, job: Job) -> bool:
        key = completion_key(job)  # None: no key, or a debounce key
        return key is not None and bool(await self.batcher.execute("EXISTS", self.keys.done(key)))

    # -- job records -----------------------------------------------------------------------

    def job_lease_backend(self, job: Job, delivery: Delivery | None = None) -> LeaseBackend:
        """Started as the consumer ``delivery`` was read as (workers sharing this broker
        each read as their own), its entry pending to that consumer."""
        holder = self.consumer if delivery is None else self._holder(delivery)
        return RedisJobLease(self.jobs, job, holder, None, delivery)

    def limited_lease_backend(
        self, job: Job, limits: Limits, delivery: Delivery | None = None
    ) -> LeaseBackend:
        holder = self.consumer if delivery is None else self._holder(delivery)
        return RedisJobLease(self.jobs, job, holder, limits, delivery)

    async def record(self, job_id: str) -> JobInfo | None:
        """The job's record; None also when its key holds another type than a hash (not a
        record aqw wrote: ``cancel`` says "unknown" and ``wait_finished`` raises
        ``UnknownJob`` for it too)."""
        return await self.waiters.read(job_id)

    async def cancel(self, job_id: str, keep_for: float = DEFAULT_KEEP_FOR) -> CancelOutcome:
        return await self.jobs.cancel(job_id, keep_for)

    async def cancel_requested(self, job_id: str) -> bool:
        return await self.jobs.cancel_requested(job_id)

    async def wait_finished(self, job_id: str, timeout: float | None) -> JobInfo:
        return await self.waiters.wait(job_id, timeout)

    async def set_job_state(self, job_id: str, state: dict[str, str], ttl: float) -> None:
        await self.status.set_job_state(job_id, state, ttl)

    async def clear_job_state(self, job_id: str) -> None:
        await self.status.clear_job_state(job_id)

    async def job_state(self, job_id: str) -> dict[str, str] | None:
        return await self.status.job_state(job_id)

    async def job_states(self, limit: int = 1000) -> list[dict[str, str]]:
        return await self.status.job_states(limit)

    async def schedule_marks(self) -> dict[str, ScheduleMark]:
        return await self.marks.marks()  # ``aqw:{q}:schedule``, shared by every process

    async def set_schedule_mark(self, task: str, mark: ScheduleMark) -> None:
        await self.marks.set_mark(task, mark)

    async def publish_heartbeat(self, worker: str, data: dict[str, Any], ttl: float) -> None:
        await self.status.publish_heartbeat(worker, data, ttl)
        await self.sample_depth(time.time())  # RedisViews: one sample per bucket

    async def heartbeats(self) -> list[dict[str, Any]]:
        """Up to 1000 heartbeats; a damaged one comes back as ``aqw._damage.damaged_heartbeat``."""
        return await self.status.heartbeats()

    async def remove_heartbeat(self, worker: str) -> None:
        await self.status.remove_heartbeat(worker)

    # -- inspection ------------------------------------------------------------------------

    async def depth(self) -> QueueDepth:
        return await self.levels.depth()  # summed over the priority levels in use

    async def stats(self) -> dict[str, int]:
        """The counters of the stats hash (at most 1000 fields); a field that is not an
        integer is left out (``aqw status`` names it)."""
        return await self.status.stats()

    # -- dead-letter queue -----------------------------------------------------------------

    async def dlq_list(self, count: int = 100, after: str | None = None) -> list[DeadJob]:
        start = f"({after}" if after else "-"
        entries: Any = await self.client.xrange(self.keys.dlq, start, "+", count=count)
        return [dead_job_of(entry_id, fields) for entry_id, fields in entries]

    async def dlq_get(self, entry_id: str) -> DeadJob | None:
        try:
            entries: Any = await self.client.xrange(self.keys.dlq, entry_id, entry_id)
        except ResponseError:
            return None
        return dead_job_of(*entries[0]) if entries else None

    async def dlq_replay(self, entries: Sequence[tuple[str, Job]]) -> int:
        jobs = [job for _, job in entries]
        return await self.levels.around(jobs, self.jobs.dlq_replay(entries))  # to their levels

    async def dlq_delete(self, entry_ids: Sequence[str]) -> int:
        if not entry_ids:
            return 0
        return int(await self.client.xdel(self.keys.dlq, *entry_ids))
