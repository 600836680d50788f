"""The settle steps of a job on Redis (``RedisSettle``): ack, retry, dead-letter, give back
and defer, each one Lua script that moves the delivery, releases the job's lease and writes
the job's record (``aqw/record.py``) and the running index together, refused when another
holder owns the job. ``RedisBroker``'s ``_ack`` and the others hand these coroutines to the
base's public steps as they are: no step of its own in between."""

from __future__ import annotations

import time
from typing import Any

from redis.asyncio import Redis

from ..._redis import scripts
from ..._redis.batch import CommandBatcher
from ..._redis.keys import GROUP, QueueKeys
from ..._redis.scripts import ms
from ...flow import completion_key
from ...job import Job
from ...lease import Lease
from ...record import UNFINISHED_KEEP
from ..messages import Delivery, Failure, Finish, failure_fields
from ._argv import ack_values, flat
from ._entries import text
from ._priorities import locate


class RedisSettle:
    """The settle steps of one queue (``RedisBroker.steps``); ``consumer``: the consumer
    that holds the delivery in the group's pending list."""

    def __init__(
        self, client: Redis, batcher: CommandBatcher, keys: QueueKeys, dlq_limit: int
    ) -> None:
        self.client = client
        self.batcher = batcher
        self.keys = keys
        self.dlq_limit = dlq_limit
        self.prefix = keys.tag + ":"
        #: ``ack.lua``'s keys per priority level, and its shared ARGV (``_ack_head``)
        self._ack_keys: dict[int, tuple[str, str, str]] = {}
        self._ack_heads: dict[tuple[str, str, float, float], tuple[Any, ...]] = {}
        self._ack = scripts.load("ack")
        self._retry = scripts.load("retry")
        self._dead = scripts.load("dead_letter")
        self._give_back = scripts.load("give_back")
        self._defer = scripts.load("defer")

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
        finish: Finish,
        record_ttl: float,
    ) -> bool:
        token = fence = ""
        if lease is not None:  # the fence lets the script skip the lease key (``ack.lua``)
            token, fence = lease.token, str(lease.fencing_token or "")
        extra: tuple[str, ...] = ()  # most jobs: no key, result nor error
        if job is not None and (
            job.key is not None
            or finish.result is not None
            or finish.note
            or finish.failure is not None
        ):
            # none for a debounce key
            idem = (completion_key(job) or "") if record_ttl > 0 else ""
            values: list[str] = []  # the script adds the state, the worker and finish time
            if finish.result is not None:
                values += ("result", finish.result)
            if finish.note:
                values += ("result_note", finish.note)
            if finish.failure is not None:
                values += flat(failure_fields(finish.failure))
            extra = ack_values(idem, values)
        keys = self._ack_keys.get(delivery.level)
        if keys is None:  # its level's stream, the stats hash and the running index
            stream, _ = locate(self.keys, delivery)
            keys = self._ack_keys[delivery.level] = (stream, self.keys.stats, self.keys.running)
        ok = await self.batcher.merged(
            self._ack,
            keys,
            self._ack_head(consumer, finish.state, finish.keep_for, record_ttl),
            (),
            (
                f"{len(extra)} {delivery.id} {token} {fence} {job.id if job is not None else ''}",
                *extra,
            ),
        )
        return bool(ok)

    def _ack_head(
        self, consumer: str, state: str, keep_for: float, record_ttl: float
    ) -> tuple[Any, ...]:
        """``ack.lua``'s shared ARGV, made once per (consumer, state, keep times)."""
        key = (consumer, state, keep_for, record_ttl)
        head = self._ack_heads.get(key)
        if head is None:
            if len(self._ack_heads) > 256:  # bounded: keep times come from task options
                self._ack_heads.clear()
            completion = ms(record_ttl) if record_ttl > 0 else 0
            head = (GROUP, consumer, self.prefix, state, ms(keep_for), completion)
            self._ack_heads[key] = head
        return head

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
    ) -> str | None:
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
        dead = await self.batcher.script(
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
        return None if dead is None else text(dead)  # the DLQ entry's id (None: refused)

    async def give_back(
        self, consumer: str, delivery: Delivery, lease: Lease | None, job: Job | None
    ) -> bool:
        key, token = self._lease_args(lease)
        job_id, record, _ = self._record_keys(job)
        stream, entry_id = locate(self.keys, delivery)
        ok = await self._give_back(
            self.client,
            [stream, key, record, self.keys.running],
            [GROUP, consumer, token, entry_id, job_id, ms(UNFINISHED_KEEP)],
        )
        return ok is not None

    async def defer(
        self, consumer: str, delivery: Delivery, job: Job, run_at: float, lease: Lease | None
    ) -> bool:
        """``defer.lua``: into the delayed set of the job's level, no attempt spent."""
        key, token = self._lease_args(lease)
        k = self.keys
        keep = UNFINISHED_KEEP + max(0.0, run_at - time.time())
        stream, entry_id = locate(k, delivery)  # back to the delayed set of its level
        ok = await self.batcher.script(
            self._defer,
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
                repr(run_at),
                job.attempt - 1,
            ],
        )
        return bool(ok)
