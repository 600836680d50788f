"""Job records kept in the process (``LocalJobRecords``, a ``JobRecords`` part that is not
shared), for brokers with no shared store for them: the memory broker (one per queue,
shared by its brokers in the process) and SQS (one per broker: other processes do not see
them). The Redis broker keeps its records in Redis instead.

Besides the part's methods, the steps of a job write them: ``enqueued`` (publish),
``started`` (the start step, ``aqw.brokers.local.start``), ``retrying``, ``deferred``,
``given_back``, ``finish`` (the settle steps, kept by ``Broker`` itself) and ``replayed``.

A record lives until its time is up (``keep_for`` after its job ended, ``UNFINISHED_KEEP``
past its due time before that); past ``MAX_RECORDS`` the records closest to their end are
dropped first, so finished records go before unfinished ones. A running record stays
running until its job's next step: when its worker died, until another worker takes the job
over (its lease expiry, in the past, tells the monitor it is orphaned).
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Callable, Mapping

from ...errors import JobCancelled, UnknownJob
from ...job import Job
from ...record import (
    DEFAULT_KEEP_FOR,
    FINAL_STATES,
    UNFINISHED_KEEP,
    JobInfo,
    queued_fields,
)
from ..messages import CancelOutcome
from .clock import clock
from .wakeup import call_in, resolve

#: Most records kept; past it those closest to their end are dropped first (a process that
#: runs millions of jobs a day must not grow without bound).
MAX_RECORDS = 100_000

#: Seconds past its lease's expiry after which a running job is taken for orphaned (its
#: worker died): a renewal on its way, or a clock a little behind, is not that.
LEASE_GRACE = 1.0

#: The fields of a running record that ``set_running_state`` updates.
RUNNING_FIELDS = ("progress", "message", "lease_expires_at")


class _Entry:
    __slots__ = ("fields", "until")

    def __init__(self, fields: dict[str, str], until: float) -> None:
        self.fields = fields
        self.until = until  # clock.monotonic() at which the record ends


def running_state(job_id: str, fields: Mapping[str, str], now: float) -> dict[str, str] | None:
    """A running record as a running-job state (the shape of ``RunningJob.state``: what
    ``JobRecords.running_state`` returns), or None when the record is not running. A job whose
    worker died stays running, its lease expiry in the past, until another worker takes it
    over: the monitor reports it as orphaned."""
    if fields.get("state") != "running":
        return None
    return {
        "state": "running",
        "job_id": job_id,
        "task": fields.get("task", ""),
        "attempt": fields.get("attempts") or "0",
        "worker": fields.get("worker", ""),
        "started_at": fields.get("started_at", ""),
        "lease_expires_at": fields.get("lease_expires_at", ""),
        "fencing_token": fields.get("fencing_token") or "0",
        "progress": fields.get("progress") or "0.0",
        "message": fields.get("message", ""),
    }


class LocalJobRecords:
    """Expiring job records and the callers waiting for a job to end, in memory."""

    #: Kept in this process only.
    shared = False

    __slots__ = ("_ends", "_limit", "_records", "_running", "_waiters", "_watchers", "queue")

    def __init__(self, queue: str, limit: int = MAX_RECORDS) -> None:
        self.queue = queue
        self._limit = max(1, limit)
        self._records: dict[str, _Entry] = {}
        #: (until, job id) of every write, soonest first; stale pairs (the record was
        #: written again since) are skipped when they come up.
        self._ends: list[tuple[float, str]] = []
        self._running: dict[str, None] = {}  # ids of running records, oldest start first
        self._waiters: dict[str, set[asyncio.Future[JobInfo | None]]] = {}
        #: The workers told at once of a running job's cancel (``watch_cancels``).
        self._watchers: list[tuple[asyncio.AbstractEventLoop, Callable[[str], None]]] = []

    def __len__(self) -> int:
        self._sweep(clock.monotonic())
        return len(self._records)

    def _entry(self, job_id: str) -> _Entry | None:
        entry = self._records.get(job_id)
        if entry is not None and entry.until <= clock.monotonic():
            self._drop(job_id)
            return None
        return entry

    def _get(self, job_id: str) -> dict[str, str] | None:
        entry = self._entry(job_id)
        return None if entry is None else entry.fields

    def _put(self, job_id: str, fields: dict[str, str], keep: float) -> None:
        now = clock.monotonic()
        until = now + max(0.0, keep)
        self._records[job_id] = _Entry(fields, until)
        state = fields.get("state")
        if state in FINAL_STATES:
            # Only ended records are swept by time: an unfinished one lives days and goes
            # when its job ends, or (checked on reading) when its time is up.
            heapq.heappush(self._ends, (until, job_id))
        if state == "running":
            self._running[job_id] = None
        else:
            self._running.pop(job_id, None)
        self._sweep(now)
        while len(self._records) > self._limit:
            self._drop_soonest()
        if len(self._ends) > 2 * len(self._records) + 1024:  # mostly stale: rebuild
            self._ends = [
                (e.until, i)
                for i, e in self._records.items()
                if e.fields.get("state") in FINAL_STATES
            ]
            heapq.heapify(self._ends)

    def _sweep(self, now: float) -> None:
        """Drop the records whose time is up."""
        while self._ends and self._ends[0][0] <= now:
            self._drop_soonest()

    def _drop_soonest(self) -> None:
        if not self._ends:  # only unfinished records: the oldest written goes
            self._drop(next(iter(self._records)))
            return
        until, job_id = heapq.heappop(self._ends)
        entry = self._records.get(job_id)
        if entry is not None and entry.until == until:
            self._drop(job_id)

    def _drop(self, job_id: str) -> None:
        del self._records[job_id]
        self._running.pop(job_id, None)
        self._wake(job_id, None)  # its waiters look again, and find no record

    def clear(self) -> None:
        """Forget every record (the queue was deleted); waiters raise ``UnknownJob``."""
        self._records.clear()
        self._ends.clear()
        self._running.clear()
        for job_id in list(self._waiters):
            self._wake(job_id, None)

    # -- the job's steps ------------------------------------------------------------------

    def enqueued(self, job: Job, run_at: float | None = None) -> None:
        """Record a job just published (``run_at`` None or past: queued) or scheduled."""
        now = clock.time()
        due = run_at if run_at is not None and run_at > now else None
        fields = queued_fields(job, due)
        self._put(job.id, fields, UNFINISHED_KEEP + (due - now if due else 0.0))

    def is_cancelled(self, job_id: str) -> bool:
        """True when the job must not start: cancelled, or its cancel was asked while it
        ran (a reclaimed or handed back attempt of it does not run again)."""
        fields = self._get(job_id)
        return fields is not None and (
            fields.get("state") == "cancelled" or fields.get("cancel") == "1"
        )

    def has_ended(self, job_id: str) -> bool:
        """True when the job's record reads a final state (succeeded, failed, dead,
        cancelled, expired): nothing of it is left to run."""
        fields = self._get(job_id)
        return fields is not None and fields.get("state") in FINAL_STATES

    def started(
        self,
        job: Job,
        worker: str,
        fence: int,
        lease_expires_at: float,
        started_at: float | None = None,
    ) -> None:
        """Record that ``job`` holds its lease and runs (since ``started_at``, default now);
        raises ``JobCancelled`` when it was cancelled before it started (nothing changes)."""
        if self.is_cancelled(job.id):
            raise JobCancelled(job.id)
        fields = dict(self._get(job.id) or {"task": job.task, "enqueued_at": repr(job.enqueued_at)})
        fields.update(
            state="running",
            attempts=str(job.attempt),
            started_at=repr(clock.time() if started_at is None else started_at),
            worker=worker,
            fencing_token=str(fence),
            lease_expires_at=repr(lease_expires_at),
            progress="",
            message="",
            run_at="",
        )
        self._put(job.id, fields, UNFINISHED_KEEP)

    def update(self, job_id: str, fields: Mapping[str, str], fence: int | None = None) -> None:
        """Update a running job's progress, message and lease expiry (other fields are
        ignored) while it still runs under fencing token ``fence`` (any, when None): a
        finished record, or one another holder runs now, is left as it is."""
        entry = self._entry(job_id)
        if entry is None or entry.fields.get("state") != "running":
            return
        if fence is not None and entry.fields.get("fencing_token") != str(fence):
            return
        entry.fields.update((k, fields[k]) for k in RUNNING_FIELDS if k in fields)
        if entry.until - clock.monotonic() < UNFINISHED_KEEP / 2:  # a job running for days
            self._put(job_id, entry.fields, UNFINISHED_KEEP)

    async def set_running_state(self, job_id: str, state: dict[str, str]) -> None:
        """A running-job state (``RunningJob.state``) updates the running record with the
        same fencing token; a state without one updates nothing."""
        try:
            fence = int(state.get("fencing_token", ""))
        except ValueError:
            return
        self.update(job_id, state, fence)

    def retrying(self, job: Job, run_at: float, failure: Mapping[str, str]) -> None:
        """Record a failed attempt whose next one (``job``) is due at ``run_at``."""
        fields = dict(self._get(job.id) or {"task": job.task, "enqueued_at": repr(job.enqueued_at)})
        fields.update(failure)
        fields.update(state="retrying", run_at=repr(run_at), attempts=str(job.attempt - 1))
        self._put(job.id, fields, UNFINISHED_KEEP + max(0.0, run_at - clock.time()))

    def deferred(self, job: Job, run_at: float) -> None:
        """Record a job put off until ``run_at`` without spending an attempt (a limit, or
        ``aqw.RateLimited``): it reads delayed, its attempts so far unchanged."""
        fields = dict(self._get(job.id) or {"task": job.task, "enqueued_at": repr(job.enqueued_at)})
        fields.update(state="delayed", run_at=repr(run_at), attempts=str(job.attempt - 1))
        self._put(job.id, fields, UNFINISHED_KEEP + max(0.0, run_at - clock.time()))

    def given_back(self, job_id: str) -> None:
        """A running job handed back unfinished waits in the queue again."""
        fields = self._get(job_id)
        if fields is not None and fields.get("state") == "running":
            self._put(job_id, {**fields, "state": "queued"}, UNFINISHED_KEEP)

    def replayed(self, job: Job) -> None:
        """A dead job put back on the queue (``dlq_replay``) waits in it again; its record
        keeps its story (attempts, last error) but not its end, DLQ entry or cancel request."""
        fields = self._get(job.id)
        if fields is None:
            self.enqueued(job)
            return
        cleared = dict.fromkeys(("run_at", "finished_at", "dlq_entry", "cancel"), "")
        self._put(job.id, {**fields, **cleared, "state": "queued"}, UNFINISHED_KEEP)

    def finish(self, job: Job, state: str, fields: Mapping[str, str], keep_for: float) -> None:
        """Record the job's end and wake whoever waits for it."""
        current = dict(self._get(job.id) or {"task": job.task})
        current.setdefault("enqueued_at", repr(job.enqueued_at))
        current.update(fields)
        current["state"] = state
        self._woken(job.id, current)  # first: a keep_for of 0 ends the record at once
        self._put(job.id, current, keep_for)

    # -- what callers ask -----------------------------------------------------------------

    def info(self, job_id: str) -> JobInfo | None:
        """The job's record, now."""
        fields = self._get(job_id)
        return None if fields is None else JobInfo.from_fields(job_id, self.queue, fields)

    async def record(self, job_id: str) -> JobInfo | None:
        return self.info(job_id)

    def states(self) -> dict[str, str]:
        """Every live record's state, by job id (``aqw.testing`` compares two of these to
        find the jobs a run ended)."""
        self._sweep(clock.monotonic())
        return {job_id: e.fields.get("state", "") for job_id, e in self._records.items()}

    async def running_state(self, job_id: str) -> dict[str, str] | None:
        """See the module function ``running_state``."""
        fields = self._get(job_id)
        return None if fields is None else running_state(job_id, fields, clock.time())

    async def running_states(self, limit: int = 1000) -> list[dict[str, str]]:
        """Up to ``limit`` jobs running now, oldest start first."""
        self._sweep(clock.monotonic())
        now = clock.time()
        out: list[dict[str, str]] = []
        for job_id in self._running:
            if len(out) >= limit:
                break
            state = running_state(job_id, self._records[job_id].fields, now)
            if state is not None:
                out.append(state)
        return out

    async def cancel(self, job_id: str, keep_for: float = DEFAULT_KEEP_FOR) -> CancelOutcome:
        entry = self._entry(job_id)
        if entry is None:
            return "unknown"
        fields = entry.fields
        state = fields.get("state", "")
        if state in FINAL_STATES:
            return "finished"
        if state == "running":
            fields["cancel"] = "1"
            self._watchers = [w for w in self._watchers if not w[0].is_closed()]
            for loop, on_cancel in self._watchers:  # the workers: the one running it stops it
                call_in(loop, on_cancel, job_id)
            return "cancelling"
        fields.update(state="cancelled", cancel="1", finished_at=repr(clock.time()))
        # Its message may still wait in the queue: the record must outlive it, or the job
        # would run once the record is gone. It lives as long as it would have unfinished.
        self._woken(job_id, fields)
        self._put(job_id, fields, max(keep_for, entry.until - clock.monotonic()))
        return "cancelled"

    async def watch_cancels(self, on_cancel: Callable[[str], None]) -> None:
        """Call ``on_cancel(job_id)`` (in the caller's loop) at each cancel of a running
        job, until cancelled."""
        watcher = (asyncio.get_running_loop(), on_cancel)
        self._watchers.append(watcher)
        try:
            await watcher[0].create_future()  # until cancelled
        finally:
            if watcher in self._watchers:  # (a closed loop's watcher may be gone already)
                self._watchers.remove(watcher)

    async def cancel_requested(self, job_id: str) -> bool:
        fields = self._get(job_id)
        return fields is not None and fields.get("cancel") == "1"

    async def wait_finished(self, job_id: str, timeout: float | None) -> JobInfo:
        """The job's record once it has ended; ``UnknownJob`` when there is none (or it
        goes), ``TimeoutError`` when it has not ended within ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = math.inf if timeout is None else clock.monotonic() + timeout
        while True:
            entry = self._entry(job_id)
            if entry is None:
                raise UnknownJob(job_id, self.queue)
            info = JobInfo.from_fields(job_id, self.queue, entry.fields)
            if info.finished:
                return info
            now = clock.monotonic()
            if now >= deadline:
                raise TimeoutError(f"job {job_id!r} has not ended within {timeout}s")
            fut: asyncio.Future[JobInfo | None] = loop.create_future()
            waiting = self._waiters.setdefault(job_id, set())
            waiting.add(fut)
            try:  # until it ends, its record goes, or the deadline: whichever comes first
                await asyncio.wait((fut,), timeout=max(0.0, min(deadline, entry.until) - now))
            finally:
                waiting.discard(fut)
                if not waiting and self._waiters.get(job_id) is waiting:
                    del self._waiters[job_id]
                fut.cancel()
            if fut.done() and not fut.cancelled() and (ended := fut.result()) is not None:
                return ended  # the record as it ended (it may be gone already: keep_for 0)

    def waiting(self, job_id: str | None = None) -> int:
        """How many callers wait (for ``job_id``, or for any job)."""
        if job_id is not None:
            return len(self._waiters.get(job_id, ()))
        return sum(len(w) for w in self._waiters.values())

    def _woken(self, job_id: str, fields: Mapping[str, str]) -> None:
        if job_id in self._waiters:
            self._wake(job_id, JobInfo.from_fields(job_id, self.queue, fields))

    def _wake(self, job_id: str, info: JobInfo | None) -> None:
        for fut in self._waiters.pop(job_id, ()):
            resolve(fut, info)  # in the waiter's own loop
