"""The enqueue steps of a job on Redis (``RedisJobs``), each one Lua script that writes the
job and its record (``aqw:{q}:job:<id>``, ``aqw/record.py``) together, so a crash can never
split the two: publish, schedule, publish with an idempotency key, replay from the DLQ. The
scripts' KEYS and ARGV are described at the top of each ``aqw/_redis/lua/*.lua``. A job's
start under its lease and its limits is in ``_job_start.py``; the settle steps (ack, retry,
dead-letter, give back, defer), also one script each, are ``RedisBroker``'s own
(``_broker.py``); cancellation is the records' (``_records.py``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis

from ..._redis import scripts
from ..._redis.batch import CommandBatcher
from ..._redis.keys import QueueKeys
from ..._redis.lease import RedisLeaseBackend
from ..._redis.scripts import ms
from ...job import Job
from ...record import UNFINISHED_KEEP, stamp
from ._argv import enqueue_args, enqueue_head

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
        self._replay = scripts.load("dlq_replay")

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
