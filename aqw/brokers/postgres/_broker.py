"""``PostgresBroker``: a queue in PostgreSQL tables (``docs/brokers/postgresql.md``).

Rows of ``aqw_jobs`` claimed ``FOR UPDATE SKIP LOCKED``; NOTIFY wakes blocking fetches;
leases are rows of ``aqw_leases`` with fencing tokens from a sequence; the start checks,
lease acquires and acks made meanwhile go out batched (``_batch.py``); other settles are one
transaction that checks the holder first. Job records (``_records.py``), marks and
heartbeats are shared tables; each step writes the job's record in its own statement or
transaction. Rate limits and per-key caps (``_flow.py``), limits changed at run time
(``_run_limits.py``), debounce (``_debounce.py``) and the depth history (``_history.py``)
are shared tables too, the atomic steps SQL functions of the migrations; a running job's
cancel is pushed to its worker by NOTIFY.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from ...flow import Limits, completion_key
from ...job import Job
from ...lease import Lease, LeaseBackend
from ..base import Broker
from ..local.start import DeliveryCheck
from ..messages import DeadJob, Delivery, Failure, Finish, QueueDepth, failure_fields
from ._batch import Batcher, shard
from ._connection import Connection, channel_of
from ._dead import DeadLetters
from ._debounce import PgDebounce
from ._flow import PgFlowLimits
from ._history import PgDepthHistory
from ._leases import PgLeases, PoolOf
from ._parts import PgScheduleMarks, PgWorkerStatus
from ._records import PgJobRecords, PgStartGuard, enqueued, new_record
from ._run_limits import PgRunLimits
from ._settle import Settles
from ._sql import statement

#: An ack: row id, lease key, lease token, completion key, job id, completion expiry, the
#: record's end (JSON; '': none), its expiry, what a missing record starts with (JSON).
AckArgs = tuple[int, str, str, str | None, str, float, str, float, str]


class PostgresBroker(Broker):
    """One queue in PostgreSQL; brokers of other queues share its connection (``sibling``)."""

    system = "postgresql"
    transient_errors = (
        ConnectionError,
        TimeoutError,
        OSError,
        asyncpg.PostgresConnectionError,
        asyncpg.InterfaceError,
        asyncpg.CannotConnectNowError,
        # A connection the server cut mid-query can fail its reset on release this way.
        asyncpg.InternalClientError,
    )

    def __init__(self, conn: Connection, queue: str) -> None:
        pool = PoolOf(self)
        self._records = PgJobRecords(pool, conn, conn.schema, queue)
        self._flow = PgFlowLimits(pool, conn.schema, queue)
        self._debounce = PgDebounce(pool, conn.schema, queue, channel_of(conn.schema, queue))
        super().__init__(
            queue,
            records=self._records,
            status=PgWorkerStatus(pool, conn.schema, queue),
            marks=PgScheduleMarks(pool, conn.schema, queue),
            flow_limits=self._flow,
            debounce=self._debounce,
            history=PgDepthHistory(pool, conn.schema, queue),
        )
        #: Limits changed at run time (``aqw limits``), in ``aqw_limits``.
        self._run_limits = self.run_limits = PgRunLimits(pool, conn.schema, queue)
        self._conn = conn
        self._s = conn.schema
        self._channel = channel_of(conn.schema, queue)
        self._wake: Any = None
        self._joined = False  # counted among the connection's users
        self._leases: PgLeases | None = None
        self._acks: Batcher[AckArgs, bool] = Batcher(self._ack_many)
        self._checks: Batcher[int, bool] = Batcher(self._held)
        self._dead = DeadLetters(PoolOf(self), self._s, queue, self._channel)
        self._steps = Settles(self, self._records)

    def describe(self) -> str:
        at = urlsplit(self._conn.dsn)
        return f"postgresql://{at.hostname}:{at.port or 5432}{at.path} queue={self.queue}"

    def sibling(self, queue: str) -> PostgresBroker:
        return PostgresBroker(self._conn, queue)

    @property
    def pool(self) -> Any:
        if self._conn.pool is None:
            raise ConnectionError(f"the {self.describe()} broker is not connected")
        return self._conn.pool

    async def connect(self) -> None:
        if self._wake is None or self._conn.pool is None:
            if not self._joined:  # once, however many callers connect at the same time
                self._joined = True
                self._conn.users += 1
            self._wake = await self._conn.listen(self._channel)

    async def start_consuming(self, consumer: str) -> None:
        await super().start_consuming(consumer)
        await self._run_limits.refresh()  # the limits changed at run time, then every 0.5 s

    async def close(self) -> None:
        """Close this broker; the connection closes with the last broker using it."""
        await self._run_limits.stop()
        if self._joined:
            self._joined = False
            self._wake = None
            self._conn.users -= 1
            if self._conn.users <= 0:
                await self._conn.close()

    #: A running job's cancel is notified to every worker of the queue (LISTEN/NOTIFY); the
    #: lease renewal still reads it when the word is lost.
    pushes_cancels = True

    async def watch_cancels(self, on_cancel: Callable[[str], None]) -> None:
        await self._records.watch_cancels(on_cancel)

    # -- producing -------------------------------------------------------------------------

    def _publish_args(self, jobs: Sequence[Job], run_at: float) -> tuple[Any, ...]:
        """``publish.sql``'s arguments: the rows and their records."""
        now = time.time()
        recs = [enqueued(j, run_at or None, now) for j in jobs]
        wires, levels = [j.encode() for j in jobs], [j.priority for j in jobs]
        ids, fields, until = [j.id for j in jobs], [r[0] for r in recs], [r[1] for r in recs]
        return self.queue, wires, levels, run_at, self._channel, ids, fields, until

    async def _insert(self, jobs: Sequence[Job], run_at: float) -> None:
        await self.connect()
        await self.pool.execute(statement("publish", self._s), *self._publish_args(jobs, run_at))

    async def publish(self, jobs: Sequence[Job]) -> None:
        await self._insert(jobs, 0.0)

    async def schedule(self, jobs: Sequence[Job], run_at: float) -> None:
        await self._insert(jobs, run_at)

    async def publish_unique(self, job: Job, ttl: float, run_at: float | None) -> tuple[str, bool]:
        assert job.key is not None
        await self.connect()
        now = time.time()
        s = self._s
        async with self.pool.acquire() as c, c.transaction():
            await c.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"{self.queue}:{job.key}")
            found = await c.fetchval(statement("key_find", s), self.queue, job.key, now)
            if found is not None:
                return found, True
            await c.execute(
                statement("key_put", s), self.queue, "key", job.key, job.id, now + ttl, now
            )
            await c.execute(statement("publish", s), *self._publish_args([job], run_at or 0.0))
        return job.id, False

    async def is_completed(self, job: Job) -> bool:
        key = completion_key(job)  # None: no key, or a debounce key
        if key is None:
            return False
        sql = (
            f'SELECT 1 FROM "{self._s}".aqw_keys '
            "WHERE queue = $1 AND kind = $2 AND key = $3 AND expires_at > $4"
        )
        return await self.pool.fetchval(sql, self.queue, "done", key, time.time()) is not None

    # -- consuming -------------------------------------------------------------------------

    async def fetch(self, count: int, block: float, share: float = 0.0) -> list[Delivery]:
        """Strict priority order (``share`` is not used: the lowest levels wait their turn)."""
        await self.connect()
        sql = statement("fetch", self._s)
        deadline = time.monotonic() + block
        while True:
            self._wake.clear()
            rows = await self.pool.fetch(sql, self.queue, count, self.consumer, time.time())
            if rows or block <= 0:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            try:  # a delayed job may have come due, or the listener been cut
                await asyncio.wait_for(self._wake.wait(), min(left, 1.0))
            except TimeoutError:
                await self._conn.relisten()
        rows = sorted(rows, key=lambda r: (-r["priority"], r["id"]))
        return [
            Delivery(str(r["id"]), bytes(r["job"]), delivery_count=r["deliveries"]) for r in rows
        ]

    async def promote_due(self) -> float | None:
        """Nothing moves (a due row is fetched where it is): seconds until the next is due."""
        if self._conn.pool is None:
            return None
        now = time.time()
        due = await self.pool.fetchval(statement("next_due", self._s), self.queue, now)
        await self._conn.end_stalled()
        await self._records.maybe_sweep()
        await self._flow.maybe_sweep()
        await self._debounce.maybe_sweep()
        return None if due is None else max(0.0, due - now)

    async def keep_alive(self, delivery: Delivery) -> bool:
        sql = statement("keep_alive", self._s)
        return (
            await self.pool.fetchval(sql, int(delivery.id), self.consumer, time.time()) is not None
        )

    async def reclaim(
        self, count: int, lease_ttl: Callable[[Job | None], float], min_idle: float
    ) -> list[Delivery]:
        now = time.time()
        sql = statement("reclaim_candidates", self._s)
        rows = await self.pool.fetch(sql, self.queue, now - min_idle, max(count * 4, 16))
        out: list[Delivery] = []
        claim = statement("reclaim_one", self._s)
        for r in rows:
            if len(out) >= count:
                break
            try:
                job: Job | None = Job.decode(bytes(r["job"]))
            except ValueError:
                job = None
            if now - r["held_at"] < lease_ttl(job):
                continue
            key = self.job_lease_key(job) if job is not None else ""
            n = await self.pool.fetchval(
                claim, r["id"], self.consumer, now, r["consumer"], r["held_at"], key
            )
            if n is not None:
                out.append(Delivery(str(r["id"]), bytes(r["job"]), delivery_count=n))
        return out

    async def give_back_unstarted(self, running: set[str]) -> int:
        sql = (
            f'UPDATE "{self._s}".aqw_jobs SET consumer = NULL WHERE queue = $1 AND consumer = $2 '
            "AND NOT (id = ANY($3::bigint[])) RETURNING 1"
        )
        async with self.pool.acquire() as c, c.transaction():
            rows = await c.fetch(sql, self.queue, self.consumer, [int(i) for i in running])
            if rows:
                await c.execute("SELECT pg_notify($1, '')", self._channel)
        return len(rows)

    # -- leases ----------------------------------------------------------------------------

    def lease_backend(self) -> LeaseBackend:
        if self._leases is None:
            self._leases = PgLeases(PoolOf(self), self._s, self.queue)
        return self._leases

    def job_lease_backend(
        self, job: Job, limits: Limits | None = None, delivery: Delivery | None = None
    ) -> LeaseBackend:
        check = None if delivery is None else self._still_ours(delivery)
        flow = (self._flow, limits) if limits else None
        row = None if delivery is None else int(delivery.id)
        return PgStartGuard(
            self.lease_backend(), self._records, job, self.consumer, check, flow, row
        )

    def _still_ours(self, delivery: Delivery) -> DeliveryCheck:
        """The start's check: a read (batched, nothing to commit) of whether the row is still
        held by this consumer; an ended job's delivery is dropped with an ack naming no job."""

        async def check(drop: bool) -> bool:
            if drop:
                return await self.ack(delivery, None, None)
            return await self._checks.submit(int(delivery.id))

        return check

    async def _held(self, ids: Sequence[int]) -> list[bool]:
        sql = f'SELECT id FROM "{self._s}".aqw_jobs WHERE id = ANY($1::bigint[]) AND consumer = $2'
        mine = {r["id"] for r in await self.pool.fetch(sql, list(ids), self.consumer)}
        return [i in mine for i in ids]

    # -- settling --------------------------------------------------------------------------

    async def _ack(
        self,
        delivery: Delivery,
        job: Job | None,
        lease: Lease | None,
        finish: Finish,
        record_ttl: float,
    ) -> bool:
        """Batched with the acks made meanwhile into one statement (``ack_many.sql``), which
        writes each job's record end too; a job acked in its handler's transaction is done."""
        if self._steps.done and delivery.id in self._steps.done:
            self._steps.done.discard(delivery.id)
            return True
        done = completion_key(job) if record_ttl > 0 else None
        now = time.time()
        end = ""
        if job is not None:
            end = json.dumps({**finish.fields(self.consumer, now), "state": finish.state})
        return await self._acks.submit(
            (
                int(delivery.id),
                lease.key if lease is not None else "",
                lease.token if lease is not None else "",
                done,
                job.id if job is not None else "",
                now + record_ttl,
                end,
                now + finish.keep_for,
                new_record(job) if job is not None else "",
            )
        )

    async def _ack_many(self, acks: Sequence[AckArgs]) -> list[bool]:
        cols = list(zip(*acks, strict=True))
        sql = statement("ack_many", self._s)
        rows = await self.pool.fetch(
            sql, *cols[:6], self.consumer, self.queue, shard(), *cols[6:], self._records.channel
        )
        gone = {r["id"] for r in rows}
        return [a[0] in gone for a in acks]

    def settle_in_transaction(
        self, delivery: Delivery, job: Job, lease: Lease, record_ttl: float, keep_for: float
    ) -> AbstractAsyncContextManager[Any]:
        return self._steps.transaction(delivery, job, lease, record_ttl, keep_for)

    async def _retry(
        self,
        delivery: Delivery,
        job: Job,
        run_at: float,
        lease: Lease | None,
        failure: Failure | None,
    ) -> bool:
        why = failure_fields(failure) if failure is not None else {}
        fields = {**why, "state": "retrying"}
        return await self._steps.move(delivery, job, run_at, lease, "retried", fields)

    async def _defer(
        self, delivery: Delivery, job: Job, run_at: float, lease: Lease | None
    ) -> bool:
        return await self._steps.move(delivery, job, run_at, lease, None, {"state": "delayed"})

    async def _give_back(self, delivery: Delivery, lease: Lease | None, job: Job | None) -> bool:
        return await self._steps.give_back(delivery, lease, job)

    async def _dead_letter(
        self,
        delivery: Delivery,
        job: Job | None,
        failure: Failure,
        attempts: int,
        lease: Lease | None,
        keep_for: float,
    ) -> str | None:
        return await self._steps.dead_letter(delivery, job, failure, attempts, lease, keep_for)

    # -- inspection ------------------------------------------------------------------------

    async def depth(self) -> QueueDepth:
        await self.connect()
        r = await self.pool.fetchrow(statement("depth", self._s), self.queue, time.time())
        return QueueDepth(r["waiting"], r["in_flight"], r["delayed"], r["dead"])

    async def stats(self) -> dict[str, int]:
        sql = (
            f'SELECT name, sum(value)::bigint AS value FROM "{self._s}".aqw_stats '
            "WHERE queue = $1 GROUP BY name"
        )
        return {r["name"]: r["value"] for r in await self.pool.fetch(sql, self.queue)}

    # -- dead letters ----------------------------------------------------------------------

    async def dlq_list(self, count: int = 100, after: str | None = None) -> list[DeadJob]:
        return await self._dead.page(count, after)

    async def dlq_get(self, entry_id: str) -> DeadJob | None:
        return await self._dead.get(entry_id)

    async def dlq_replay(self, entries: Sequence[tuple[str, Job]]) -> int:
        return len(await self._dead.replay(entries))

    async def dlq_delete(self, entry_ids: Sequence[str]) -> int:
        return await self._dead.delete(entry_ids)
