"""What a worker knows about the jobs it runs: its counters, and each running job's state
(what ``app.job_status`` and the stuck-job watchdog see)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..brokers.base import Broker
from ..context import Context
from ..job import Job
from ..lease import Lease
from ..telemetry import JobTrace


@dataclass(slots=True)
class WorkerStats:
    """Counters of one worker since it started."""

    processed: int = 0
    failed: int = 0
    retried: int = 0
    dead: int = 0
    lease_lost: int = 0
    lease_busy: int = 0
    stale_starts: int = 0  # starts refused: the delivery was no longer ours, or had ended
    deferred: int = 0  # put off by a rate limit, a per-key cap or ``RateLimited``
    requeued: int = 0
    malformed: int = 0
    duplicates_skipped: int = 0
    cancelled: int = 0
    expired: int = 0
    stuck: int = 0
    loop_blocked: int = 0  # event-loop stalls the watchdog saw (``_watchdog.py``)

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


class RunningJob:
    """A job while it runs here: what ``app.job_status`` and the watchdog see."""

    __slots__ = ("ctx", "job", "lease", "message", "progress", "published", "started", "trace")

    def __init__(self, job: Job, lease: Lease, trace: JobTrace, ctx: Context) -> None:
        self.job = job
        self.lease = lease
        self.trace = trace
        self.ctx = ctx
        self.started = time.time()
        self.progress = 0.0
        self.message = ""
        self.published = False

    def state(self, worker: str) -> dict[str, str]:
        return {
            "state": "running",
            "job_id": self.job.id,
            "task": self.job.task,
            "attempt": str(self.job.attempt),
            "worker": worker,
            "started_at": repr(self.started),
            "lease_expires_at": repr(self.lease.expires_at),
            "fencing_token": str(self.lease.fencing_token),
            "progress": repr(self.progress),
            "message": self.message,
        }


class EndedRun:
    """A job that ended lately, as the blocked-loop watchdog names it: only its job is kept,
    so what it ran with (its lease, its context, its delivery) is freed when it ends."""

    __slots__ = ("job",)

    def __init__(self, job: Job) -> None:
        self.job = job


#: A running job enters the queue's running index (what ``aqw status`` and the monitor list)
#: once it has run this long, or reports progress, so the many short jobs cost nothing there.
STATE_AFTER = 0.5

#: Jobs that ended lately, remembered (with when) for the blocked-loop watchdog: a handler
#: that blocks the loop may end before the watchdog wakes to name it.
ENDED_KEPT = 32


def vars_of(obj: Any) -> dict[str, Any]:
    """A slotted dataclass as a dict."""
    return {name: getattr(obj, name) for name in obj.__slots__}


class RunningJobs:
    """The jobs running in one worker, by job id, and the publishing of their state.

    A job's record reads ``running`` from the step that took its lease, and each renewal
    moves its lease expiry on; once it has run ``STATE_AFTER`` seconds, or reports progress,
    its state is published (``broker.set_job_state``), which lists it among the running
    jobs; its settle step writes how it ended."""

    def __init__(
        self, broker: Broker, worker: str, spawn: Callable[[Awaitable[Any]], None]
    ) -> None:
        self._broker = broker
        self._worker = worker
        self._spawn = spawn
        self._runs: dict[str, RunningJob] = {}
        self._ended: deque[tuple[float, Job]] = deque(maxlen=ENDED_KEPT)

    def __len__(self) -> int:
        return len(self._runs)

    def __iter__(self) -> Iterator[RunningJob]:
        return iter(list(self._runs.values()))

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._runs

    def get(self, job_id: str) -> RunningJob | None:
        return self._runs.get(job_id)

    def ids(self) -> set[str]:
        return set(self._runs)

    def add(self, run: RunningJob) -> None:
        self._runs[run.job.id] = run

    def finish(self, run: RunningJob) -> None:
        """The job ended here: forget it."""
        if self._runs.get(run.job.id) is run:
            del self._runs[run.job.id]
            self._ended.append((time.monotonic(), run.job))

    def ended_since(self, when: float) -> list[EndedRun]:
        """Jobs (of the last ``ENDED_KEPT``) that ended at or after ``when`` (monotonic)."""
        return [EndedRun(job) for ended, job in self._ended if ended >= when]

    def publish_due(self) -> None:
        """Publish the state of jobs that have now run ``STATE_AFTER`` seconds (checked by
        the heartbeat loop, so short jobs cost no timer and no round trip)."""
        horizon = time.time() - STATE_AFTER
        for run in list(self._runs.values()):
            if not run.published and run.started <= horizon:
                run.published = True
                self._spawn(self.publish(run))

    def cancel(self, job_id: str) -> None:
        """``app.cancel`` asked for the running job ``job_id`` to stop: stop its handler."""
        run = self._runs.get(job_id)
        if run is not None:
            run.ctx.mark_cancelled()

    async def publish(self, run: RunningJob) -> None:
        run.published = True
        await self._broker.set_job_state(run.job.id, run.state(self._worker), run.lease.ttl)

    async def report_progress(self, job_id: str, fraction: float, message: str) -> None:
        """Record a running job's progress and publish its state at once."""
        run = self._runs.get(job_id)
        if run is None:
            return
        run.progress, run.message = fraction, message
        await self.publish(run)
