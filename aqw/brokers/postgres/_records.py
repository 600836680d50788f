"""Job records in PostgreSQL (``PgJobRecords``, a shared ``JobRecords`` part) and the job's
start step that takes its lease and marks its record running in one transaction
(``PgStartGuard``).

A record is a row of ``aqw_records``: the flat map of string fields of ``aqw/record.py`` as
jsonb, and its expiry. The broker's steps write it in the statement or transaction that
moves the job (``publish.sql``, ``ack_many.sql``, the settle transactions); an end is
notified on the queue's records channel with the job ids as payload (those of one batch of
acks joined by ','), which wakes ``wait_finished`` (LISTEN/NOTIFY). Records past their time
are deleted in batches (``sweep``, run with each ``promote_due``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...errors import JobCancelled, StaleStart, UnknownJob
from ...flow import Limits
from ...job import Job
from ...lease import LeaseBackend
from ...record import (
    DEFAULT_KEEP_FOR,
    FINAL_STATES,
    UNFINISHED_KEEP,
    JobInfo,
    queued_fields,
)
from ..local.records import RUNNING_FIELDS, running_state
from ..local.start import DeliveryCheck
from ..messages import CancelOutcome
from ._batch import Batcher
from ._connection import Connection, channel_of
from ._flow import PgFlowLimits
from ._sql import statement

#: Records deleted per statement of the expiry sweep.
SWEEP_BATCH = 1000

#: Seconds between two expiry sweeps of a broker (sooner while a sweep fills its batch).
SWEEP_EVERY = 5.0

#: Seconds a waiter waits for a notification before it reads the record again (and reopens
#: a listener the server cut): a safety net, not the way an end is heard.
REREAD_EVERY = 30.0


#: Seconds between tries to listen for cancels while the server is away (doubling).
RESUBSCRIBE = (0.1, 5.0)

log = logging.getLogger("aqw.brokers.postgres")

#: A start: job id, lease key, token, ttl in ms, what a missing record starts with (JSON),
#: the running record's fields but the fencing token (JSON), and the delivery's row id and
#: consumer, whose hold the start checks (None and '': no delivery to check).
Start = tuple[str, str, str, int, str, str, int | None, str]


def records_channel(schema: str, queue: str) -> str:
    """The channel on which a queue's job ends are notified (payload: job ids, by ',')."""
    return channel_of(f"{schema}.records", queue)


def cancels_channel(schema: str, queue: str) -> str:
    """The channel on which the cancels of a queue's running jobs are notified (payload: the
    job id), committed with the cancel's mark: every worker of the queue listens there."""
    return channel_of(f"{schema}.cancels", queue)


def new_record(job: Job) -> str:
    """What a step writes into a record that is missing (JSON)."""
    return json.dumps({"task": job.task, "enqueued_at": repr(job.enqueued_at)})


def enqueued(job: Job, run_at: float | None, now: float) -> tuple[str, float]:
    """The record of a job just published or scheduled (JSON) and its expiry."""
    due = run_at if run_at is not None and run_at > now else None
    fields = queued_fields(job, due)
    return json.dumps(fields), now + UNFINISHED_KEEP + (due - now if due else 0.0)


def _fields(raw: Any) -> dict[str, str]:
    value = json.loads(raw) if isinstance(raw, str | bytes) else raw
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


class PgJobRecords:
    """The job records of one queue in ``aqw_records``, seen by every process."""

    shared = True

    def __init__(self, pool: Any, conn: Connection, schema: str, queue: str) -> None:
        self._pool, self._conn, self._s, self.queue = pool, conn, schema, queue
        self.schema = schema
        #: Where job ends are notified; ``jobs_channel``: where the queue's rows are.
        self.channel = records_channel(schema, queue)
        self.jobs_channel = channel_of(schema, queue)
        self.cancels = cancels_channel(schema, queue)
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._listening = False
        self._swept = 0.0  # time.monotonic() of the last sweep
        #: The starts made while one is on its way go out together (``start_many.sql``).
        self.starts: Batcher[Start, tuple[str, int | None]] = Batcher(self._start_many)

    async def _start_many(self, calls: Sequence[Start]) -> list[tuple[str, int | None]]:
        keys = [c[1] for c in calls]
        if len(set(keys)) < len(keys):  # one statement may not write a lease twice
            return [(await self._start_many([c]))[0] for c in calls]
        cols = list(zip(*calls, strict=True))
        until = time.time() + UNFINISHED_KEEP
        sql = statement("start_many", self._s)
        rows = await self._pool.fetch(sql, self.queue, *cols[:6], until, *cols[6:])
        by_id = {r["job_id"]: r for r in rows}
        out: list[tuple[str, int | None]] = []
        for c in calls:
            r = by_id[c[0]]
            out.append((r["status"], None if r["fence"] is None else int(r["fence"])))
        return out

    # -- the steps' writes (in the step's transaction ``c``) ---------------------------------

    async def put(self, c: Any, job: Job, fields: Mapping[str, str], until: float) -> None:
        sql = statement("record_put", self._s)
        await c.execute(sql, self.queue, job.id, new_record(job), json.dumps(fields), until)

    async def ended(self, c: Any, job: Job, fields: Mapping[str, str], keep_for: float) -> None:
        """The job's end, and its waiters woken when the transaction commits."""
        await self.put(c, job, fields, time.time() + keep_for)
        await c.execute("SELECT pg_notify($1, $2)", self.channel, job.id)

    async def given_back(self, c: Any, job_id: str) -> None:
        sql = statement("record_given_back", self._s)
        await c.execute(sql, self.queue, job_id, time.time() + UNFINISHED_KEEP)

    async def maybe_sweep(self) -> None:
        """A sweep, when ``SWEEP_EVERY`` has passed since the last (or it filled its batch)."""
        now = time.monotonic()
        if now - self._swept >= SWEEP_EVERY:
            full = await self.sweep() >= SWEEP_BATCH
            self._swept = 0.0 if full else now

    async def sweep(self) -> int:
        """Delete one batch of records past their time; how many went."""
        done = await self._pool.execute(
            statement("records_sweep", self._s), time.time(), SWEEP_BATCH
        )
        return int(done.split()[-1]) if isinstance(done, str) and done else 0

    # -- what callers ask ----------------------------------------------------------------------

    async def _read(self, job_id: str, live: bool = True) -> dict[str, str] | None:
        sql = statement("record_get", self._s)
        row = await self._pool.fetchrow(sql, self.queue, job_id, time.time() if live else None)
        return None if row is None else _fields(row["fields"])

    async def record(self, job_id: str) -> JobInfo | None:
        fields = await self._read(job_id)
        return None if fields is None else JobInfo.from_fields(job_id, self.queue, fields)

    async def cancel(self, job_id: str, keep_for: float = DEFAULT_KEEP_FOR) -> CancelOutcome:
        now = time.time()
        await self._pool.connected()
        async with self._pool.acquire() as c, c.transaction():
            row = await c.fetchrow(statement("record_lock", self._s), self.queue, job_id, now)
            if row is None:
                return "unknown"
            state = _fields(row["fields"]).get("state", "")
            if state in FINAL_STATES:
                return "finished"
            put = f'UPDATE "{self._s}".aqw_records SET fields = fields || $3::jsonb, '
            put += "until = $4 WHERE queue = $1 AND job_id = $2"
            if state == "running":
                await c.execute(put, self.queue, job_id, '{"cancel": "1"}', row["until"])
                # Heard by its worker at the commit (``watch_cancels``); else its renewal reads it.
                await c.execute("SELECT pg_notify($1, $2)", self.cancels, job_id)
                return "cancelling"
            # Its row may still wait in the queue: the record outlives it (its start is refused).
            ended = json.dumps({"state": "cancelled", "cancel": "1", "finished_at": repr(now)})
            await c.execute(put, self.queue, job_id, ended, max(now + keep_for, row["until"]))
            await c.execute("SELECT pg_notify($1, $2)", self.channel, job_id)
        return "cancelled"

    async def cancel_requested(self, job_id: str) -> bool:
        fields = await self._read(job_id)
        return fields is not None and fields.get("cancel") == "1"

    async def set_running_state(self, job_id: str, state: dict[str, str]) -> None:
        fence = state.get("fencing_token", "")
        if not fence.isdigit():
            return
        await self.update(job_id, state, fence)

    async def update(self, job_id: str, fields: Mapping[str, str], fence: str | None) -> None:
        moved = json.dumps({k: fields[k] for k in RUNNING_FIELDS if k in fields})
        await self._pool.execute(
            statement("record_running", self._s), self.queue, job_id, moved, fence
        )

    async def running_state(self, job_id: str) -> dict[str, str] | None:
        fields = await self._read(job_id)
        return None if fields is None else running_state(job_id, fields, time.time())

    async def running_states(self, limit: int = 1000) -> list[dict[str, str]]:
        rows = await self._pool.fetch(statement("records_running", self._s), self.queue, limit)
        out = []
        for r in rows:
            state = running_state(r["job_id"], _fields(r["fields"]), time.time())
            if state is not None:
                out.append(state)
        return out

    async def wait_finished(self, job_id: str, timeout: float | None) -> JobInfo:
        """The record once the job has ended, woken by its end's notification."""
        if not self._listening:
            await self._conn.subscribe(self.channel, self._heard)
            self._listening = True
        loop = asyncio.get_running_loop()
        deadline = math.inf if timeout is None else loop.time() + timeout
        woken = False
        while True:
            fut: asyncio.Future[None] = loop.create_future()
            waiting = self._waiters.setdefault(job_id, set())
            waiting.add(fut)
            try:  # registered before the read: an end between the two is not missed
                # Woken by its end: read it even past its time (a keep_for of 0).
                fields = await self._read(job_id, live=not woken)
                if fields is None:
                    raise UnknownJob(job_id, self.queue)
                info = JobInfo.from_fields(job_id, self.queue, fields)
                if info.finished:
                    return info
                left = deadline - loop.time()
                if left <= 0:
                    raise TimeoutError(f"job {job_id!r} has not ended within {timeout}s")
                await asyncio.wait((fut,), timeout=min(left, REREAD_EVERY))
                woken = fut.done()
                if not woken:
                    await self._conn.relisten()
            finally:
                waiting.discard(fut)
                if not waiting and self._waiters.get(job_id) is waiting:
                    del self._waiters[job_id]
                fut.cancel()

    async def watch_cancels(self, on_cancel: Callable[[str], None]) -> None:
        """Call ``on_cancel(job_id)`` for each cancel of a running job of the queue, until
        cancelled: the process's listening connection (reopened after a cut by the next
        fetch that waits without a word) hears the queue's cancels channel. At most once:
        a cancel notified while the listener is down is read with the lease's renewal."""
        pause = RESUBSCRIBE[0]
        while True:
            try:
                await self._conn.subscribe(self.cancels, on_cancel)
                break
            except Exception as exc:  # the server away: renewals read the cancels meanwhile
                log.debug("listening for cancels of queue %s: %r; trying again", self.queue, exc)
                await asyncio.sleep(pause)
                pause = min(RESUBSCRIBE[1], pause * 2)
        try:
            await asyncio.Event().wait()
        finally:
            self._conn.unsubscribe(self.cancels, on_cancel)

    def _heard(self, payload: str) -> None:
        """A notification of ended jobs: their ids, joined by ',' (the acks' batch)."""
        for job_id in payload.split(","):
            for fut in self._waiters.get(job_id, ()):
                if not fut.done():
                    fut.set_result(None)

    def waiting(self) -> int:
        """How many callers wait for a job's end."""
        return sum(len(w) for w in self._waiters.values())


class PgStartGuard:
    """A job's lease backend whose ``acquire`` is its start step: in one statement
    (``start_many.sql``, batched with the starts made meanwhile) it locks the job's record,
    refuses a cancelled job (``JobCancelled``) or an ended one (``StaleStart``, its delivery
    dropped), takes the lease and marks the record running with its fencing token;
    ``renew`` moves the record's lease expiry on (under the same fencing token). A job under
    rate limits or per-key caps starts in ``aqw_start_limited`` (``_flow.py``, batched with
    the limited starts made meanwhile), which checks the limits in the same transaction."""

    __slots__ = (
        "_backend", "_delivery", "_fence", "_flow", "_job", "_records", "_row", "_worker",
    )  # fmt: skip

    def __init__(
        self,
        backend: LeaseBackend,
        records: PgJobRecords,
        job: Job,
        worker: str,
        delivery: DeliveryCheck | None,
        flow: tuple[PgFlowLimits, Limits] | None = None,
        row: int | None = None,
    ) -> None:
        self._backend, self._records = backend, records
        self._job, self._worker, self._delivery = job, worker, delivery
        self._flow = flow
        #: The delivery's row: its hold by ``worker`` is checked in the start's statement.
        self._row = row
        self._fence: int | None = None

    async def acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        job, mine, now = self._job, self._delivery, time.time()
        checked_apart = mine is not None and (self._flow is not None or self._row is None)
        if checked_apart and mine is not None and not await mine(False):  # else in the start
            raise StaleStart(job.id)
        running = {
            "state": "running",
            "attempts": str(job.attempt),
            "started_at": repr(now),
            "worker": self._worker,
            "lease_expires_at": repr(now + ttl_ms / 1000),
            "progress": "",
            "message": "",
            "run_at": "",
        }
        if self._flow is not None:
            flow, limits = self._flow
            ask = (key, token, ttl_ms, new_record(job), json.dumps(running))
            status, fence = await flow.start(limits, job.id, ask)
        else:
            start = (job.id, key, token, ttl_ms, new_record(job), json.dumps(running), self._row,
                     self._worker if self._row is not None else "")  # fmt: skip
            status, fence = await self._records.starts.submit(start)
        if status == "gone":  # another consumer holds the delivery now, or it settled
            raise StaleStart(job.id)
        if status == "cancelled":
            raise JobCancelled(job.id)
        if status == "ended":
            if mine is not None:
                await mine(True)
            raise StaleStart(job.id, ended=True)
        self._fence = fence
        return fence

    async def renew(self, key: str, token: str, ttl_ms: int) -> bool:
        renewed = await self._backend.renew(key, token, ttl_ms)
        if renewed and self._fence is not None:
            expires = {"lease_expires_at": repr(time.time() + ttl_ms / 1000)}
            await self._records.update(self._job.id, expires, str(self._fence))
        return renewed

    async def release(self, key: str, token: str) -> bool:
        return await self._backend.release(key, token)
