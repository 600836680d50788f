"""Redis Streams broker: a consumer group per queue, manual acks, recovery per job's lease.

Layout (all keys share the ``{queue}`` hash tag): ``aqw:{q}:stream`` holds unfinished jobs
(entries are deleted when settled, so it stays bounded), ``aqw:{q}:delayed`` (ZSET by due
time), ``aqw:{q}:dlq`` (capped stream), ``aqw:{q}:fence`` (fencing counter),
``aqw:{q}:lease:<job id>``, ``aqw:{q}:stats``, and per job its record ``aqw:{q}:job:<id>``
(``aqw/record.py``; written by the same scripts that move the job, ``_redis_jobs.py``), the
``aqw:{q}:running`` index of running jobs, ``aqw:{q}:schedule`` (the periodic tasks' marks,
``_redis_schedule.py``) and, while someone waits for a job to end, ``aqw:{q}:waiters:<id>``
and the waiting processes' inboxes (``aqw/_redis/waiters.py``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError, ResponseError, TimeoutError

from .._redis import scripts as _scripts
from .._redis.batch import CommandBatcher
from .._redis.client import MAX_BLOCK, describe_broker, make_client, split_queue
from .._redis.keys import GROUP, QueueKeys
from .._redis.lease import RedisLeaseBackend
from .._redis.waiters import JobWaiters
from ..job import Job
from ..lease import Lease, LeaseBackend
from ..record import DEFAULT_KEEP_FOR, JobInfo
from ._local_records import CancelOutcome
from ._redis_jobs import RedisJobLease, RedisJobs
from ._redis_records import dead_job_of, decode_job, delivery_of, text
from ._redis_schedule import RedisSchedule
from ._redis_status import RedisStatus
from ._schedule_marks import ScheduleMark
from .base import Broker, DeadJob, Delivery, Failure, Finish, QueueDepth

__all__ = ["MAX_BLOCK", "RedisBroker", "make_client", "split_queue"]

#: One reclaim looks at up to ``max(RECLAIM_SCAN_MIN, count * RECLAIM_SCAN_FACTOR)`` idle
#: pending entries.
RECLAIM_SCAN_MIN = 16
RECLAIM_SCAN_FACTOR = 4


class RedisBroker(Broker):
    """A queue on Redis Streams.

    Args:
        client: a ``redis.asyncio.Redis`` (or cluster) client, or a ``redis://`` URL.
        queue: the queue name.
        dlq_limit: most entries the dead-letter stream keeps; older ones are trimmed and
            counted in ``stats()['dlq_trimmed']``.
    """

    system = "redis"
    describe = describe_broker  # Broker.describe: ``redis://host:port/db queue=q``
    #: redis-py's connection and timeout errors, besides the built-in ones.
    transient_errors = (ConnectionError, TimeoutError, *Broker.transient_errors)

    def __init__(self, client: Redis | str, queue: str = "default", *, dlq_limit: int = 100_000):
        super().__init__(queue)
        self.url = client if isinstance(client, str) else None
        self.client: Redis = make_client(client) if isinstance(client, str) else client
        self._owns_client = isinstance(client, str)
        self.keys = QueueKeys(queue)
        self.dlq_limit = dlq_limit
        self.batcher = CommandBatcher(self.client)
        self.status = RedisStatus(self.client, self.batcher, self.keys)
        self._leases = RedisLeaseBackend(self.batcher, fence_key=self.keys.fence)
        self.jobs = RedisJobs(self.client, self.batcher, self.keys, self._leases, dlq_limit)
        self.waiters = JobWaiters(self.client, self.batcher, self.keys)
        self.marks = RedisSchedule(self.client, self.keys)
        self._keep_alive = _scripts.load("keep_alive")
        self._promote = _scripts.load("promote")
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

    async def publish(self, jobs: Sequence[Job]) -> None:
        await self.jobs.publish(jobs)

    async def publish_unique(self, job: Job, ttl: float, run_at: float | None) -> tuple[str, bool]:
        job_id, duplicate = await self.jobs.publish_unique(job, ttl, run_at)
        return text(job_id), bool(duplicate)

    async def schedule(self, jobs: Sequence[Job], run_at: float) -> None:
        await self.jobs.publish(jobs, run_at)

    # -- consuming -------------------------------------------------------------------------

    async def fetch(self, count: int, block: float) -> list[Delivery]:
        block_ms = max(1, int(min(block, MAX_BLOCK) * 1000))
        try:
            reply: Any = await self.client.xreadgroup(
                GROUP, self.consumer, {self.keys.stream: ">"}, count=count, block=block_ms
            )
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            await self._ensure_group()  # the stream was deleted under us: recreate, read again
            return []
        if not reply:
            return []
        return [delivery_of(entry_id, fields) for entry_id, fields in reply[0][1] if fields]

    #: Where the next reclaim scan of the pending entries starts (``-``: the beginning).
    _reclaim_from = "-"

    async def reclaim(
        self, count: int, lease_ttl: Callable[[Job | None], float], min_idle: float
    ) -> list[Delivery]:
        if count <= 0 or not self.consumer:
            return []
        limit = max(RECLAIM_SCAN_MIN, count * RECLAIM_SCAN_FACTOR)
        try:
            pending: Any = await self.client.xpending_range(
                self.keys.stream,
                GROUP,
                self._reclaim_from,
                "+",
                limit,
                idle=max(0, int(min_idle * 1000)),
            )
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            await self._ensure_group()
            return []
        # A full page: scan on from its end next time, so entries past the first ``limit``
        # idle ones (waiting for a longer TTL) cannot hide due ones forever.
        full = len(pending) >= limit
        self._reclaim_from = f"({text(pending[-1]['message_id'])}" if full else "-"
        candidates = [(text(p["message_id"]), int(p["time_since_delivered"])) for p in pending]
        if not candidates:
            return []
        pipe = self.client.pipeline(transaction=False)
        for entry_id, _ in candidates:
            pipe.xrange(self.keys.stream, entry_id, entry_id)
        ranges: list[Any] = await pipe.execute()
        due = self._due_for_reclaim(candidates, ranges, lease_ttl, count)
        if len(due) >= count:
            self._reclaim_from = "-"  # due entries may be left over in this page
        if not due:
            return []
        keys: list[str] = [self.keys.stream]
        argv: list[Any] = [GROUP, self.consumer]
        for entry_id, own_ms, lease_key, _ in due:
            keys.append(lease_key or self.keys.lease("-"))
            argv += [entry_id, own_ms, 1 if lease_key else 0]
        claimed: Any = await self.batcher.script(_scripts.load("reclaim"), keys, argv)
        fields_of = {entry_id: fields for entry_id, _, _, fields in due}
        out = []
        for entry_id, delivered in claimed:
            fields = fields_of.get(text(entry_id))
            if fields is not None:  # None: deleted from the stream, now dropped from the PEL
                out.append(delivery_of(entry_id, fields, int(delivered)))
        return out

    def _due_for_reclaim(
        self,
        candidates: list[tuple[str, int]],
        ranges: list[Any],
        lease_ttl: Callable[[Job | None], float],
        count: int,
    ) -> list[tuple[str, int, str | None, dict[Any, Any] | None]]:
        """The candidates idle for at least their own job's lease TTL, at most ``count`` of
        them: (entry id, that TTL in ms, the job's lease key or None, the entry's fields or
        None when it is no longer in the stream)."""
        due: list[tuple[str, int, str | None, dict[Any, Any] | None]] = []
        for (entry_id, idle_ms), entries in zip(candidates, ranges, strict=True):
            fields: dict[Any, Any] | None = entries[0][1] if entries else None
            job = decode_job(fields)
            own_ms = max(0, math.ceil(lease_ttl(job) * 1000))
            if idle_ms < own_ms:
                continue
            due.append((entry_id, own_ms, self.job_lease_key(job) if job else None, fields))
            if len(due) >= count:
                break
        return due

    async def give_back_unstarted(self, running: set[str]) -> int:
        if not self.consumer:
            return 0
        pending: Any = await self.client.xpending_range(
            self.keys.stream, GROUP, "-", "+", 1000, consumername=self.consumer
        )
        given = 0
        for entry in pending:
            entry_id = text(entry["message_id"])
            if entry_id not in running and await self.requeue(Delivery(entry_id, b""), None):
                given += 1
        return given

    async def promote_due(self) -> float | None:
        moved, next_due = await self.batcher.script(
            self._promote, [self.keys.delayed, self.keys.stream], [int(time.time() * 1000), 500]
        )
        if int(moved) >= 500:
            return 0.0
        if int(next_due) < 0:
            return None
        return max(0.0, int(next_due) / 1000 - time.time())

    def lease_backend(self) -> LeaseBackend:
        return self._leases

    def job_lease_key(self, job: Job) -> str:
        return self.keys.lease(job.id)

    def lock_key(self, name: str) -> str:
        return self.keys.lock(name)

    async def keep_alive(self, delivery: Delivery) -> bool:
        ok = await self.batcher.script(
            self._keep_alive, [self.keys.stream], [GROUP, self.consumer, delivery.id]
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
        return await self.jobs.ack(self.consumer, delivery, job, lease, record_ttl, finish)

    async def retry(
        self,
        delivery: Delivery,
        job: Job,
        run_at: float,
        lease: Lease | None,
        failure: Failure | None = None,
    ) -> bool:
        return await self.jobs.retry(self.consumer, delivery, job, run_at, lease, failure)

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
            self.consumer, delivery, job, failure, attempts, lease, keep_for
        )
        return None if entry is None else text(entry)  # the DLQ entry's id (None: refused)

    async def requeue(
        self, delivery: Delivery, lease: Lease | None, job: Job | None = None
    ) -> bool:
        return await self.jobs.requeue(self.consumer, delivery, lease, job)

    async def is_completed(self, job: Job) -> bool:
        if job.key is None:
            return False
        return bool(await self.batcher.execute("EXISTS", self.keys.done(job.key)))

    # -- job records -----------------------------------------------------------------------

    def job_lease_backend(self, job: Job) -> LeaseBackend:
        return RedisJobLease(self.jobs, job, self.consumer)

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

    async def heartbeats(self) -> list[dict[str, Any]]:
        """Up to 1000 heartbeats; a damaged one comes back as ``aqw._damage.damaged_heartbeat``."""
        return await self.status.heartbeats()

    async def remove_heartbeat(self, worker: str) -> None:
        await self.status.remove_heartbeat(worker)

    # -- inspection ------------------------------------------------------------------------

    async def depth(self) -> QueueDepth:
        pipe = self.client.pipeline(transaction=False)
        pipe.xlen(self.keys.stream)
        pipe.zcard(self.keys.delayed)
        pipe.xlen(self.keys.dlq)
        length, delayed, dead = await pipe.execute()
        try:
            pending = await self.client.xpending(self.keys.stream, GROUP)
            in_flight = int(pending["pending"])
        except ResponseError:
            in_flight = 0
        return QueueDepth(max(0, length - in_flight), in_flight, delayed, dead)

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
        return await self.jobs.dlq_replay(entries)

    async def dlq_delete(self, entry_ids: Sequence[str]) -> int:
        if not entry_ids:
            return 0
        return int(await self.client.xdel(self.keys.dlq, *entry_ids))
