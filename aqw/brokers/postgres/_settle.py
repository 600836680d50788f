"""The settles of a PostgreSQL queue other than the batched ack: each one transaction that
locks the held row, checks its holder (the lease's token, or without a live lease this
consumer) and only then moves the job and writes its record (``Settles``); and the ack made
in the handler's own transaction (``ctx.transaction()``, ``Settles.transaction``)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

from ...errors import LeaseLost
from ...flow import completion_key
from ...job import Job
from ...lease import Lease
from ...record import UNFINISHED_KEEP
from ..messages import Delivery, Failure, Finish
from ._batch import shard
from ._connection import IDLE_IN_TRANSACTION
from ._records import PgJobRecords
from ._sql import statement

#: A settle's own writes, given its transaction's connection and the locked held row.
Step = Callable[[Any, Any], Awaitable[Any]]


class Queue(Protocol):
    """What the settles ask of their broker."""

    queue: str
    consumer: str

    @property
    def pool(self) -> Any: ...


class Settles:
    """Retry, defer, give back and dead-letter on one queue, and the transaction under them."""

    def __init__(self, broker: Queue, records: PgJobRecords) -> None:
        self._b = broker
        self._records = records
        self._s = records.schema
        self._channel = records.jobs_channel
        #: Deliveries acked in a handler's transaction: the worker's own ack after the
        #: handler returns finds them settled already.
        self.done: set[str] = set()

    async def settle(
        self, delivery: Delivery, lease: Lease | None, job: Job | None, step: Step
    ) -> Any:
        """Run ``step(conn, row)`` in one transaction, when the held row is still ours."""
        if self.done and delivery.id in self.done:  # acked in its handler's transaction:
            self.done.discard(delivery.id)  # nothing is left to move (the job succeeded)
            return None
        async with self._b.pool.acquire() as c, c.transaction():
            return await self.held(c, delivery, lease, job, step)

    async def held(
        self, c: Any, delivery: Delivery, lease: Lease | None, job: Job | None, step: Step
    ) -> Any:
        """In transaction ``c``: lock the held row and release the job's lease when ``lease``
        (or, without a live lease, this consumer) still holds it, then ``step(c, row)``;
        None, touching nothing, when another holder has it now."""
        s = self._s
        if job is not None:
            # The job's record first, then its lease, then its row: the order every
            # statement that starts or settles a job locks them in (``start_many.sql``,
            # ``ack_many.sql``), so a resumed ex-holder's settle and the new holder's start
            # or ack of the same job wait for each other in turn, never in a cycle (a
            # deadlock the server broke by failing one of them).
            await c.execute(statement("record_lock", s), self._b.queue, job.id, 0.0)
        row = await c.fetchrow(statement("take", s), int(delivery.id))
        if row is None:
            return None
        owner = None
        if lease is not None:
            owner = await c.fetchval(statement("lease_owner", s), lease.key)
            if owner is not None and owner != lease.token:
                return None
        if owner is None and row["consumer"] != self._b.consumer:
            return None
        if lease is not None and owner is not None:
            await c.execute(f'DELETE FROM "{s}".aqw_leases WHERE key = $1', lease.key)
        return await step(c, row)

    @asynccontextmanager
    async def transaction(
        self, delivery: Delivery, job: Job, lease: Lease, record_ttl: float, keep_for: float
    ) -> AsyncIterator[Any]:
        """A connection in a transaction for the handler's writes; at the block's clean end
        the fenced ack runs in it (the held row's lease must still hold ``lease.token``),
        then it commits. Refused: ``LeaseLost`` and everything rolls back."""
        s, queue = self._s, self._b.queue

        async def step(c: Any, row: Any) -> bool:
            await c.execute(f'DELETE FROM "{s}".aqw_jobs WHERE id = $1', int(delivery.id))
            await c.execute(statement("bump", s), queue, "processed", shard())
            now = time.time()
            done = completion_key(job)  # a debounce key is no idempotency key
            if done is not None and record_ttl > 0:
                put = statement("key_put", s)
                await c.execute(put, queue, "done", done, job.id, now + record_ttl, now)
            end = {**Finish(keep_for=keep_for).fields(self._b.consumer, now), "state": "succeeded"}
            await self._records.ended(c, job, end, keep_for)
            return True

        async with self._b.pool.acquire() as c:
            c.lent()  # the handler may leave session state: the full reset at release
            async with c.transaction():
                # The handler may wait on anything inside its transaction: no idle bound.
                await c.execute("SET LOCAL idle_in_transaction_session_timeout = 0")
                yield c
                # The fenced ack locks the job's row, its lease and a shared counter: a
                # holder frozen before the commit must not keep them (``_connection.py``).
                await c.execute(
                    f"SET LOCAL idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION}'"
                )
                if not await self.held(c, delivery, lease, job, step):
                    raise LeaseLost(lease.key, "another holder has the job: its writes roll back")
            self.done.add(delivery.id)

    async def move(
        self,
        delivery: Delivery,
        job: Job,
        run_at: float,
        lease: Lease | None,
        stat: str | None,
        fields: dict[str, str],
    ) -> bool:
        """Put the job back due at ``run_at``; its record takes ``fields`` (and ``run_at``)."""
        fields = {**fields, "run_at": repr(run_at), "attempts": str(job.attempt - 1)}
        until = UNFINISHED_KEEP + max(run_at, time.time())

        async def step(c: Any, row: Any) -> bool:
            await self._records.put(c, job, fields, until)
            sql = (
                f'UPDATE "{self._s}".aqw_jobs SET job = $2, priority = $3, run_at = $4, '
                "consumer = NULL, held_at = NULL WHERE id = $1"
            )
            await c.execute(sql, int(delivery.id), job.encode(), job.priority, run_at)
            if stat is not None:
                await c.execute(statement("bump", self._s), self._b.queue, stat, shard())
            await c.execute("SELECT pg_notify($1, '')", self._channel)
            return True

        return bool(await self.settle(delivery, lease, job, step))

    async def give_back(self, delivery: Delivery, lease: Lease | None, job: Job | None) -> bool:
        async def step(c: Any, row: Any) -> bool:
            sql = f'UPDATE "{self._s}".aqw_jobs SET consumer = NULL, held_at = NULL WHERE id = $1'
            await c.execute(sql, int(delivery.id))
            if job is not None:
                await self._records.given_back(c, job.id)
            await c.execute("SELECT pg_notify($1, '')", self._channel)
            return True

        return bool(await self.settle(delivery, lease, job, step))

    async def dead_letter(
        self,
        delivery: Delivery,
        job: Job | None,
        failure: Failure,
        attempts: int,
        lease: Lease | None,
        keep_for: float,
    ) -> str | None:
        async def step(c: Any, row: Any) -> str:
            await c.execute(f'DELETE FROM "{self._s}".aqw_jobs WHERE id = $1', int(delivery.id))
            entry = await c.fetchval(
                statement("dead_insert", self._s),
                self._b.queue,
                delivery.data,
                job.task if job else "",
                job.id if job else "",
                failure.error_type,
                failure.error,
                failure.traceback,
                attempts,
                failure.first_failed_at or failure.failed_at,
                failure.failed_at,
                failure.worker,
            )
            await c.execute(statement("bump", self._s), self._b.queue, "dead", shard())
            if job is not None:
                worker = failure.worker or self._b.consumer
                end = Finish(failure=failure).fields(worker, time.time())
                end.update(state="dead", dlq_entry=str(entry))
                await self._records.ended(c, job, end, keep_for)
            return str(entry)

        entry: str | None = await self.settle(delivery, lease, job, step)
        return entry
