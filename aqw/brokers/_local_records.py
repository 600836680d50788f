"""Job records kept in the process, for brokers with no shared store for them: the memory
broker (one per queue, shared by its brokers in the process) and SQS (one per broker: other
processes do not see them). The Redis broker keeps its records in Redis instead."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Literal

from ..errors import JobCancelled, UnknownJob
from ..job import Job
from ..lease import LeaseBackend
from ..record import FINAL_STATES, UNFINISHED_KEEP, JobInfo, stamp

CancelOutcome = Literal["cancelled", "cancelling", "finished", "unknown"]

#: Most records kept; past it the oldest are dropped first (a process that runs millions of
#: jobs a day must not grow without bound).
MAX_RECORDS = 100_000


class LocalRecords:
    """Expiring job records and the callers waiting for a job to end, in memory."""

    __slots__ = ("_records", "_waiters", "queue")

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self._records: dict[str, tuple[dict[str, str], float]] = {}
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}

    def __len__(self) -> int:
        return len(self._records)

    def _get(self, job_id: str) -> dict[str, str] | None:
        entry = self._records.get(job_id)
        if entry is None:
            return None
        if entry[1] < time.monotonic():
            del self._records[job_id]
            return None
        return entry[0]

    def _put(self, job_id: str, fields: dict[str, str], keep: float) -> None:
        self._records.pop(job_id, None)  # re-inserted last: the dict stays oldest-first
        self._records[job_id] = (fields, time.monotonic() + max(0.0, keep))
        while len(self._records) > MAX_RECORDS:
            del self._records[next(iter(self._records))]

    # -- the job's steps ------------------------------------------------------------------

    def enqueued(self, job: Job, run_at: float | None = None) -> None:
        """Record a job just published (``run_at`` None or past: queued) or scheduled."""
        now = time.time()
        due = run_at if run_at is not None and run_at > now else None
        fields = {
            "state": "delayed" if due is not None else "queued",
            "task": job.task,
            "attempts": str(job.attempt - 1),
            "enqueued_at": repr(job.enqueued_at),
            "run_at": stamp(due),
            "expires_at": stamp(job.expires_at),
            "key": job.key or "",
        }
        self._put(job.id, fields, UNFINISHED_KEEP + (due - now if due else 0.0))

    def started(self, job: Job, worker: str, fence: int, lease_expires_at: float) -> None:
        """Record that ``job`` holds its lease and runs; raises ``JobCancelled`` when it was
        cancelled before it started (nothing changes)."""
        fields = self._get(job.id)
        if fields is not None and fields.get("state") == "cancelled":
            raise JobCancelled(job.id)
        fields = dict(fields or {"task": job.task, "enqueued_at": repr(job.enqueued_at)})
        fields.update(
            state="running",
            attempts=str(job.attempt),
            started_at=repr(time.time()),
            worker=worker,
            fencing_token=str(fence),
            lease_expires_at=repr(lease_expires_at),
            progress="",
            message="",
        )
        self._put(job.id, fields, UNFINISHED_KEEP)

    def update(self, job_id: str, fields: Mapping[str, str], fence: int | None = None) -> None:
        """Update a running job's fields (progress, lease expiry) while it still runs under
        fencing token ``fence`` (any, when None)."""
        current = self._get(job_id)
        if current is None or current.get("state") != "running":
            return
        if fence is not None and current.get("fencing_token") != str(fence):
            return
        current.update(fields)

    def retrying(self, job: Job, run_at: float, failure: Mapping[str, str]) -> None:
        """Record a failed attempt whose next one (``job``) is due at ``run_at``."""
        fields = dict(self._get(job.id) or {"task": job.task})
        fields.update(failure)
        fields.update(state="retrying", run_at=repr(run_at), attempts=str(job.attempt - 1))
        self._put(job.id, fields, UNFINISHED_KEEP + max(0.0, run_at - time.time()))

    def requeued(self, job_id: str) -> None:
        """A running job handed back unfinished waits in the queue again."""
        fields = self._get(job_id)
        if fields is not None and fields.get("state") == "running":
            fields["state"] = "queued"

    def finish(self, job: Job, state: str, fields: Mapping[str, str], keep_for: float) -> None:
        """Record the job's end and wake whoever waits for it."""
        current = dict(self._get(job.id) or {"task": job.task})
        current.setdefault("enqueued_at", repr(job.enqueued_at))
        current.update(fields)
        current["state"] = state
        self._put(job.id, current, keep_for)
        self._wake(job.id)

    # -- what callers ask -----------------------------------------------------------------

    def info(self, job_id: str) -> JobInfo | None:
        fields = self._get(job_id)
        return None if fields is None else JobInfo.from_fields(job_id, self.queue, fields)

    def cancel(self, job_id: str, keep_for: float) -> CancelOutcome:
        fields = self._get(job_id)
        if fields is None:
            return "unknown"
        state = fields.get("state", "")
        if state in FINAL_STATES:
            return "finished"
        if state == "running":
            fields["cancel"] = "1"
            return "cancelling"
        fields.update(state="cancelled", cancel="1", finished_at=repr(time.time()))
        self._put(job_id, fields, keep_for)
        self._wake(job_id)
        return "cancelled"

    def cancel_requested(self, job_id: str) -> bool:
        fields = self._get(job_id)
        return fields is not None and fields.get("cancel") == "1"

    async def wait(self, job_id: str, timeout: float | None) -> JobInfo:
        loop = asyncio.get_running_loop()
        while True:
            info = self.info(job_id)
            if info is None:
                raise UnknownJob(job_id, self.queue)
            if info.finished:
                return info
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.setdefault(job_id, []).append(fut)
            try:
                async with asyncio.timeout(timeout):
                    await fut
            finally:
                waiting = self._waiters.get(job_id)
                if waiting is not None and fut in waiting:
                    waiting.remove(fut)
                    if not waiting:
                        del self._waiters[job_id]

    def _wake(self, job_id: str) -> None:
        for fut in self._waiters.pop(job_id, []):
            if not fut.done():
                fut.set_result(None)


class LocalStartGuard:
    """A job's lease backend whose ``acquire`` also marks the job running in ``records``
    (and refuses a cancelled job with ``JobCancelled``): the default of
    ``Broker.job_lease_backend``."""

    __slots__ = ("_backend", "_job", "_records", "_worker")

    def __init__(self, backend: LeaseBackend, records: LocalRecords, job: Job, worker: str):
        self._backend = backend
        self._records = records
        self._job = job
        self._worker = worker

    async def acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        info = self._records.info(self._job.id)
        if info is not None and info.state == "cancelled":
            raise JobCancelled(self._job.id)
        fence = await self._backend.acquire(key, token, ttl_ms)
        if fence is not None:
            try:
                self._records.started(self._job, self._worker, fence, time.time() + ttl_ms / 1000)
            except JobCancelled:  # cancelled while the acquire was on its way
                await self._backend.release(key, token)
                raise
        return fence

    async def renew(self, key: str, token: str, ttl_ms: int) -> bool:
        return await self._backend.renew(key, token, ttl_ms)

    async def release(self, key: str, token: str) -> bool:
        return await self._backend.release(key, token)
