"""The steps of a job on Redis, each one Lua script that moves the job and writes its record
(``aqw:{q}:job:<id>``, ``aqw/record.py``) together, so a crash can never split the two:
enqueue, start (the job's lease), settle (ack, retry, dead-letter, requeue), replay from the
DLQ and cancel. ``RedisBroker`` delegates to ``RedisJobs``; the scripts' KEYS and ARGV are
described at the top of each ``aqw/_redis/lua/*.lua``. A job's start under its lease and its
limits, and its deferral, are in ``_redis_start.py``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, cast

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from .._redis import scripts
from .._redis.batch import CommandBatcher
from .._redis.keys import GROUP, QueueKeys
from .._redis.lease import RedisLeaseBackend
from ..job import Job
from ..lease import Lease
from ..record import UNFINISHED_KEEP, stamp
from ._debounce import completion_key
from ._local_records import CancelOutcome
from ._redis_argv import ack_values, enqueue_args, enqueue_head, flat, ms
from ._redis_levels import locate
from .base import Delivery, Failure, Finish, failure_fields

#: Most jobs one enqueue script call takes (``publish`` and ``schedule`` of more: one call
#: per chunk, sent together).
ENQUEUE_CHUNK = 1000


class RedisJobs:
    """The job steps of one queue (``RedisBroker.jobs``)."""

    def __init__(
        self,
        client: Redis,
        batcher: CommandBatcher,
        keys: QueueKeys,
        leases: RedisLeaseBackend,
        dlq_limit: int,
    ) -> None:
        self.client = client
        self.batcher = batcher
        self.keys = keys
        self.leases = leases
        self.dlq_limit = dlq_limit
        #: The prefix of every key of the queue (``aqw:{q}:``): scripts build per-job keys.
        self.prefix = keys.tag + ":"
        self.enqueue = scripts.load("enqueue")
        #: ``enqueue.lua``'s keys and shared ARGV for the common job: level 0, due now, no
        #: key, no expiry (``_enqueue_head`` of such a job, made once).
        self._now_keys = (keys.stream, keys.delayed)
        self._now_head = (self.prefix, ms(UNFINISHED_KEEP), 0, "", "", "")
        #: The lone enqueue of a job due now: ``enqueue.lua``'s step in fewer arguments.
        self.enqueue_one = scripts.load("enqueue_one")
        self._one_keep = str(ms(UNFINISHED_KEEP)).encode()
        self._record_prefix = keys.record("")  # + a job id: its record's key
        #: A lone enqueue is on its way on its own (``publish``).
        self._sending = False
        self.unique = scripts.load("enqueue_unique")
        self.job_start = scripts.load("job_start")
        self.job_renew = scripts.load("job_renew")
        self._ack = scripts.load("ack")
        self._retry = scripts.load("retry")
        self._dead = scripts.load("dead_letter")
        self._requeue = scripts.load("requeue")
        self._replay = scripts.load("dlq_replay")
        self._cancel = scripts.load("cancel")

    # -- producing -------------------------------------------------------------------------

    async def publish(self, jobs: Sequence[Job], due: float | None = None) -> None:
        """Enqueue ``jobs`` now (``due`` None) or at ``due``: one call for a single job
        (concurrent single enqueues share one), else one call per ``ENQUEUE_CHUNK``."""
        if not jobs:
            return
        if len(jobs) == 1:
            await self._publish_one(jobs[0], due)
            return
        now = time.time()
        later = due is not None and due > now
        keep = UNFINISHED_KEEP + (due - now if due is not None and later else 0.0)
        level = jobs[0].priority  # the stream and delayed set of the jobs' priority level
        shared = (self.keys.stream_for(level), self.keys.delayed_for(level))
        calls = []
        for start in range(0, len(jobs), ENQUEUE_CHUNK):
            chunk = jobs[start : start + ENQUEUE_CHUNK]
            # The jobs of one enqueue call share their task's expiry and level, have no key.
            argv: list[Any] = [*enqueue_head(self.prefix, keep, due, later, chunk[0])]
            for job in chunk:
                if (
                    job.expires_at != chunk[0].expires_at
                    or job.key is not None
                    or job.priority != level
                ):
                    await self.publish([job], due)  # a mixed batch: that job on its own
                    continue
                argv += (job.encode(), job.id, job.task, job.enqueued_at)
            calls.append(self.batcher.script(self.enqueue, list(shared), argv))
        await asyncio.gather(*calls)

    async def _publish_one(self, job: Job, due: float | None) -> None:
        """One job: sent at once when no other lone enqueue is on its way (a direct call,
        no batch to form; ``enqueue_one.lua`` when it is due now and has no key), else
        through the batcher, merged with the single enqueues queued meanwhile into one
        ``enqueue.lua`` call."""
        if not self._sending and due is None and job.key is None:
            self._sending = True
            try:
                argv = [job.encode(), job.task, job.enqueued_at, self._one_keep]
                if job.expires_at is not None:
                    argv.append(stamp(job.expires_at))
                stream = self.keys.stream_for(job.priority) if job.priority else self._now_keys[0]
                await self.enqueue_one(self.client, [stream, self._record_prefix + job.id], argv)
            finally:
                self._sending = False
            return
        if due is None and job.key is None and job.expires_at is None and not job.priority:
            keys, head = self._now_keys, self._now_head  # the common job
        else:
            now = time.time()
            later = due is not None and due > now
            keep = UNFINISHED_KEEP + (due - now if due is not None and later else 0.0)
            keys = (self.keys.stream_for(job.priority), self.keys.delayed_for(job.priority))
            head = enqueue_head(self.prefix, keep, due, later, job)
        item = (job.encode(), job.id, job.task, job.enqueued_at)
        if self._sending:
            await self.batcher.merged(self.enqueue, keys, head, (), item)
            return
        self._sending = True
        try:
            await self.enqueue(self.client, list(keys), [*head, *item])
        finally:
            self._sending = False

    async def publish_unique(self, job: Job, ttl: float, run_at: float | None) -> Any:
        assert job.key is not None
        keys = self.keys
        return await self.batcher.script(
            self.unique,
            [
                keys.idempotency(job.key),
                keys.stream_for(job.priority),
                keys.delayed_for(job.priority),
                keys.done(job.key),
                keys.record(job.id),
            ],
            [job.id, ms(ttl), *enqueue_args(job, run_at, time.time())],
        )

    # -- settling --------------------------------------------------------------------------

    def _lease_args(self, lease: Lease | None) -> tuple[str, str]:
        if lease is None:
            return self.keys.lease("-"), ""
        return lease.key, lease.token

    def _record_keys(self, job: Job | None) -> tuple[str, str, str]:
        """(job id or '', its record key, its waiters key): a key of the queue's slot that
        is never written stands in for a job that did not decode."""
        job_id = job.id if job is not None else ""
        name = job_id or "-"
        return job_id, self.keys.record(name), self.keys.waiters(name)

    async def ack(
        self,
        consumer: str,
        delivery: Delivery,
        job: Job | None,
        lease: Lease | None,
        record_ttl: float,
        finish: Finish | None,
    ) -> bool:
        finish = finish or Finish()
        token = lease.token if lease is not None else ""
        idem = (completion_key(job) or "") if record_ttl > 0 else ""  # none for a debounce key
        values: list[str] = []
        if job is not None:  # the script adds the state, the worker and the finish time
            if finish.result is not None:
                values += ("result", finish.result)
            if finish.note:
                values += ("result_note", finish.note)
            if finish.failure is not None:
                values += flat(failure_fields(finish.failure))
        stream, entry_id = locate(self.keys, delivery)  # its level's stream
        extra = ack_values(idem, values)  # most jobs: no key, result nor error
        ok = await self.batcher.merged(
            self._ack,
            (stream, self.keys.stats, self.keys.running),
            (
                GROUP,
                consumer,
                self.prefix,
                finish.state,
                ms(finish.keep_for),
                ms(record_ttl) if record_ttl > 0 else 0,
            ),
            (),
            (f"{len(extra)} {entry_id} {token} {job.id if job is not None else ''}", *extra),
        )
        return bool(ok)

    async def retry(
        self,
        consumer: str,
        delivery: Delivery,
        job: Job,
        run_at: float,
        lease: Lease | None,
        failure: Failure | None,
    ) -> bool:
        key, token = self._lease_args(lease)
        fields = {
            "state": "retrying",
            "run_at": repr(run_at),
            "attempts": str(job.attempt - 1),  # ``job`` is the next attempt: runs so far
            "task": job.task,
            "enqueued_at": repr(job.enqueued_at),
        }
        if failure is not None:
            fields.update(failure_fields(failure))
        keep = UNFINISHED_KEEP + max(0.0, run_at - time.time())
        k = self.keys
        stream, entry_id = locate(k, delivery)  # back to the delayed set of its level:
        ok = await self.batcher.script(
            self._retry,
            [stream, k.delayed_for(job.priority), key, k.stats, k.record(job.id), k.running],
            [
                GROUP,
                token,
                entry_id,
                int(run_at * 1000),
                job.encode(),
                consumer,
                job.id,
                ms(keep),
                *flat(fields),
            ],
        )
        return bool(ok)

    async def dead_letter(
        self,
        consumer: str,
        delivery: Delivery,
        job: Job | None,
        failure: Failure,
        attempts: int,
        lease: Lease | None,
        keep_for: float,
    ) -> Any:
        key, token = self._lease_args(lease)
        job_id, record, waiters = self._record_keys(job)
        values: list[str] = []
        if job is not None:
            fields = {"finished_at": repr(time.time())}
            if failure.worker or consumer:
                fields["worker"] = failure.worker or consumer
            fields.update(failure_fields(failure))
            fields.update(task=job.task, enqueued_at=repr(job.enqueued_at))
            values = flat(fields)
        entry: list[Any] = [
            "j",
            delivery.data,
            "task",
            job.task if job else "",
            "job_id",
            job_id,
            "error_type",
            failure.error_type,
            "error",
            failure.error,
            "tb",
            failure.traceback,
            "attempts",
            attempts,
            "first",
            repr(failure.first_failed_at or failure.failed_at),
            "last",
            repr(failure.failed_at),
            "worker",
            failure.worker,
        ]
        k = self.keys
        stream, entry_id = locate(k, delivery)
        return await self.batcher.script(
            self._dead,
            [stream, k.dlq, key, k.stats, record, waiters, k.running],
            [
                GROUP,
                token,
                entry_id,
                self.dlq_limit,
                consumer,
                job_id,
                ms(keep_for),
                len(values),
                *values,
                *entry,
            ],
        )

    async def requeue(
        self, consumer: str, delivery: Delivery, lease: Lease | None, job: Job | None
    ) -> bool:
        key, token = self._lease_args(lease)
        job_id, record, _ = self._record_keys(job)
        stream, entry_id = locate(self.keys, delivery)
        ok = await self._requeue(
            self.client,
            [stream, key, record, self.keys.running],
            [GROUP, consumer, token, entry_id, job_id, ms(UNFINISHED_KEEP)],
        )
        return ok is not None

    async def dlq_replay(self, entries: Sequence[tuple[str, Job]]) -> int:
        levels = sorted({job.priority for _, job in entries})
        if len(levels) > 1:  # one call per level: each job back to its own level's stream
            parts = [[e for e in entries if e[1].priority == lv] for lv in levels]
            return sum([await self.dlq_replay(part) for part in parts])
        if not entries:
            return 0
        keys = [self.keys.dlq, self.keys.stream_for(levels[0])]
        argv: list[Any] = [ms(UNFINISHED_KEEP)]
        for entry_id, job in entries:
            keys.append(self.keys.record(job.id))
            argv += [
                entry_id,
                job.encode(),
                job.task,
                job.attempt - 1,
                repr(job.enqueued_at),
                stamp(job.expires_at),
                job.key or "",
            ]
        return int(await self._replay(self.client, keys, argv))

    # -- records ---------------------------------------------------------------------------

    async def cancel(self, job_id: str, keep_for: float) -> CancelOutcome:
        k = self.keys
        outcome = await self.batcher.script(
            self._cancel,
            [k.record(job_id), k.waiters(job_id), k.stats],
            [job_id, ms(keep_for), repr(time.time())],
        )
        text = outcome.decode() if isinstance(outcome, bytes) else str(outcome)
        return cast(CancelOutcome, text)

    async def cancel_requested(self, job_id: str) -> bool:
        try:
            # asked with each renewal of the job's lease: by the priority lane, as the renewal
            flag = await self.batcher.priority.execute("HGET", self.keys.record(job_id), "cancel")
        except ResponseError:  # WRONGTYPE: not a record aqw wrote
            return False
        return flag in (b"1", "1")
