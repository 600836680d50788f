"""Redis Streams broker: a consumer group per queue, manual acks, recovery per job's lease.

Layout (all keys share the ``{queue}`` hash tag): ``aqw:{q}:stream`` holds unfinished jobs
(entries are deleted when settled, so it stays bounded), ``aqw:{q}:delayed`` (ZSET by due
time), ``aqw:{q}:dlq`` (capped stream), ``aqw:{q}:fence`` (fencing counter),
``aqw:{q}:lease:<job id>``, ``aqw:{q}:stats``, and per job its record ``aqw:{q}:job:<id>``
(``aqw/record.py``; written by the same scripts that move the job), the ``aqw:{q}:running``
index of running jobs, ``aqw:{q}:schedule`` (the periodic tasks' marks) and, while someone
waits for a job to end, ``aqw:{q}:waiters:<id>`` and the waiting processes' inboxes
(``aqw/_redis/waiters.py``). A priority level N > 0 has its own ``aqw:{q}:stream:pN`` and
``aqw:{q}:delayed:pN``, listed in ``aqw:{q}:levels`` (``_priorities.py``).

Every part is shared: the records (``_records.py``), heartbeats (``_status.py``), schedule
marks (``_marks.py``), depth history (``_history.py``), debounce (``_debounce.py``), the
limits its start step enforces (``_job_start.py``) and its server (``_server.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError, ResponseError, TimeoutError

from ..._redis import scripts as _scripts
from ..._redis.batch import CommandBatcher
from ..._redis.client import MAX_BLOCK, describe_broker, make_client
from ..._redis.cluster import CLUSTER_TRANSIENT_ERRORS, is_cluster
from ..._redis.connections import open_spares
from ..._redis.keys import GROUP, QueueKeys
from ..._redis.lease import RedisLeaseBackend
from ..._redis.waiters import JobWaiters
from ...flow import Limits, completion_key
from ...job import Job
from ...lease import Lease, LeaseBackend
from ..base import Broker
from ..local import ShareCredit
from ..messages import DeadJob, Delivery, Failure, Finish, QueueDepth
from ..parts import StartLimits
from ._batches import RedisBatchCounts
from ._cancels import listen_cancels
from ._control import RedisQueueControl
from ._debounce import RedisDebounce
from ._entries import dead_job_of, text
from ._fair import RedisFairShares
from ._history import RedisDepthHistory
from ._job_start import RedisJobLease
from ._jobs import RedisJobs
from ._marks import RedisScheduleMarks
from ._priorities import RedisLevels, locate
from ._progress import RedisProgress
from ._rates import RedisJobRates
from ._records import RedisJobRecords
from ._run_limits import RedisRunLimits
from ._server import RedisServer
from ._settle import RedisSettle
from ._status import RedisWorkerStatus, read_stats
from ._wait import wait_together

#: Rate limits and caps are enforced in ``job_start.lua``, for every worker of the queue.
LIMITS = StartLimits(shared=True)

Step = Coroutine[Any, Any, bool]


class RedisBroker(Broker):
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
        self.url = client if isinstance(client, str) else None
        self.client: Redis = make_client(client) if isinstance(client, str) else client
        self._owns_client = isinstance(client, str)
        self.keys = keys = QueueKeys(queue, partition)
        self.dlq_limit = dlq_limit
        self.batcher = batcher = CommandBatcher(self.client)
        self.levels = RedisLevels(batcher, keys)  # priority levels
        self.waiters = JobWaiters(self.client, batcher, keys)
        super().__init__(
            queue,
            records=RedisJobRecords(self.client, batcher, keys, self.waiters),
            status=RedisWorkerStatus(self.client, keys),
            marks=RedisScheduleMarks(self.client, keys),
            history=RedisDepthHistory(self.client, batcher, keys, self.levels),
            debounce=RedisDebounce(batcher, keys, self.levels),
            flow_limits=LIMITS,
            server=RedisServer(self.client, [keys]),
            batches=RedisBatchCounts(self.client, keys, self.levels),
            control=RedisQueueControl(self.client, keys, self.levels),
            rates=RedisJobRates(self.client, keys),
        )
        self._leases = RedisLeaseBackend(batcher, fence_key=keys.fence)
        self.jobs = RedisJobs(self.client, batcher, keys, self._leases, dlq_limit)
        self.steps = RedisSettle(self.client, batcher, keys, dlq_limit)
        self._share = ShareCredit()
        self.fair_shares = RedisFairShares(batcher, keys, self.levels)
        self._run_limits = self.run_limits = RedisRunLimits(self.client, keys)
        self.progress = RedisProgress(self.client, batcher, keys)
        #: The consumer names this broker has read as (``_holder``).
        self._read_as: set[str] = set()
        self._keep_alive = _scripts.load("keep_alive")
        self._group_ready = False

    def sibling(self, queue: str) -> RedisBroker:
        """Queue ``queue`` on this broker's client (one connection pool)."""
        return RedisBroker(self.client, queue, dlq_limit=self.dlq_limit)

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

    @property
    def pushes_cancels(self) -> bool:  # type: ignore[override]
        return isinstance(self.client, Redis)

    async def watch_cancels(self, on_cancel: Callable[[str], None]) -> None:
        """Cancels of running jobs, pushed on the queue's channel (``_cancels.py``); a
        cluster client has no plain pub/sub here: its workers read them with each renewal."""
        if isinstance(self.client, Redis):
            await listen_cancels(self.client, [self.keys], on_cancel, self.transient_errors)

    async def close(self) -> None:
        await self._run_limits.stop()
        await self.waiters.close()
        if self._owns_client:
            await self.client.aclose()

    # -- producing -------------------------------------------------------------------------

    # A job of a priority level > 0 announces its level (``_priorities.py``) the first
    # time this process uses it, in the same round trip as its enqueue.

    async def publish(self, jobs: Sequence[Job]) -> None:
        await self.levels.around(jobs, self.jobs.publish(jobs))

    async def publish_unique(self, job: Job, ttl: float, run_at: float | None) -> tuple[str, bool]:
        step = self.jobs.publish_unique(job, ttl, run_at)
        job_id, duplicate = await self.levels.around([job], step)
        return text(job_id), bool(duplicate)

    async def schedule(self, jobs: Sequence[Job], run_at: float) -> None:
        await self.levels.around(jobs, self.jobs.publish(jobs, run_at))

    async def is_completed(self, job: Job) -> bool:
        key = completion_key(job)  # None: no key, or a debounce key
        return key is not None and bool(await self.batcher.execute("EXISTS", self.keys.done(key)))

    # -- consuming -------------------------------------------------------------------------

    async def start_consuming(self, consumer: str) -> None:
        """Also opens the connections its lease renewals go by (``open_spares``)."""
        await super().start_consuming(consumer)
        await open_spares(self.client)
        await self._run_limits.refresh()  # the limits changed at run time, then every 0.5 s

    async def fetch(self, count: int, block: float, share: float = 0.0) -> list[Delivery]:
        """Highest priority level first (a share from the lowest waiting one), reading the
        levels in use in the same step (``RedisLevels.fetch``); ``block`` <= 0: no wait."""
        block_ms = max(1, int(min(block, MAX_BLOCK) * 1000)) if block > 0 else 0
        lowest = len(self.levels.active) > 1 and self._share.turn(share)
        self._read_as.add(self.consumer)
        return await self.levels.fetch(self.consumer, count, block_ms, lowest)

    async def fetch_together(
        self, queues: Sequence[Broker], consumer: str, count: int, block: float
    ) -> list[tuple[int, Delivery]] | None:
        """One blocking read over the streams of ``queues`` when they are plain Redis queues
        on this broker's client, not a cluster's (``_wait.py``); None otherwise."""
        same = [q for q in queues if type(q) is RedisBroker and q.client is self.client]
        if len(same) != len(queues) or is_cluster(self.client):
            return None
        return await wait_together(same, consumer, count, block)

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
                if entry_id not in running and await self.give_back(back, None):
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

    async def keep_alive(self, delivery: Delivery) -> bool:
        """Sent with each renewal of the job's lease: by the batcher's priority lane."""
        stream, entry_id = locate(self.keys, delivery)  # the stream of its level
        ok = await self.batcher.priority.script(
            self._keep_alive, [stream], [GROUP, self._holder(delivery), entry_id]
        )
        return bool(ok)

    # -- leases and the job's start ----------------------------------------------------------

    def lease_backend(self) -> LeaseBackend:
        return self._leases

    def job_lease_key(self, job: Job) -> str:
        return self.keys.lease(job.id)

    def lock_key(self, name: str) -> str:
        return self.keys.lock(name)

    def job_lease_backend(
        self, job: Job, limits: Limits | None = None, delivery: Delivery | None = None
    ) -> LeaseBackend:
        """Started as the consumer ``delivery`` was read as (workers sharing this broker
        each read as their own), its entry pending to that consumer (``job_start.lua``)."""
        holder = self.consumer if delivery is None else self._holder(delivery)
        return RedisJobLease(self.jobs, job, holder, limits, delivery)

    # -- settling: one script each (``_settle.py``), handed to the base's steps as it is ----

    def _ack(
        self,
        delivery: Delivery,
        job: Job | None,
        lease: Lease | None,
        finish: Finish,
        record_ttl: float,
    ) -> Step:
        return self.steps.ack(self._holder(delivery), delivery, job, lease, finish, record_ttl)

    def _retry(
        self,
        delivery: Delivery,
        job: Job,
        run_at: float,
        lease: Lease | None,
        failure: Failure | None,
    ) -> Step:
        return self.steps.retry(self._holder(delivery), delivery, job, run_at, lease, failure)

    def _dead_letter(
        self,
        delivery: Delivery,
        job: Job | None,
        failure: Failure,
        attempts: int,
        lease: Lease | None,
        keep_for: float,
    ) -> Coroutine[Any, Any, str | None]:
        holder = self._holder(delivery)
        return self.steps.dead_letter(holder, delivery, job, failure, attempts, lease, keep_for)

    def _give_back(self, delivery: Delivery, lease: Lease | None, job: Job | None) -> Step:
        return self.steps.give_back(self._holder(delivery), delivery, lease, job)

    def _defer(self, delivery: Delivery, job: Job, run_at: float, lease: Lease | None) -> Step:
        return self.steps.defer(self._holder(delivery), delivery, job, run_at, lease)

    # -- inspection ------------------------------------------------------------------------

    async def depth(self) -> QueueDepth:
        return await self.levels.depth()  # summed over the priority levels in use

    async def stats(self) -> dict[str, int]:
        """The counters of the stats hash (at most 1000 fields); a field that is not an
        integer is left out (``aqw status`` names it)."""
        return await read_stats(self.client, self.keys)

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
