"""What a worker knows about the jobs it runs: its counters, and each running job's state
(what ``app.job_status`` and the stuck-job watchdog see)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .._text import plural
from ..brokers.base import Broker
from ..brokers.parts import ProgressStream
from ..context import Context, job_fields
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

    def summary(self) -> str:
        """The counters for people, those above 0 only: ``3 succeeded, 1 retried,
        1 dead-lettered; 2 failed attempts in all``. A retried attempt is a failed one, so
        the failed attempts are said once, as the total they are, and only when some were
        not retried."""
        parts = [f"{self.processed} succeeded"]
        parts += [f"{n} {label}" for label, n in self._others() if n]
        said = ", ".join(parts)
        if self.failed != self.retried:
            said += f"; {plural(self.failed, 'failed attempt')} in all"
        return said

    def _others(self) -> list[tuple[str, int]]:
        return [
            ("retried", self.retried),
            ("dead-lettered", self.dead),
            ("cancelled", self.cancelled),
            ("expired", self.expired),
            ("skipped as duplicates", self.duplicates_skipped),
            ("malformed", self.malformed),
            ("deferred by a limit", self.deferred),
            ("handed back", self.requeued),
            ("lost to another holder", self.lease_lost),
            ("held by another holder", self.lease_busy),
            ("reported stuck", self.stuck),
            ("event-loop stalls", self.loop_blocked),
        ]


class RunningJob:
    """A job while it runs here: what ``app.job_status`` and the watchdog see."""

    __slots__ = (
        "ctx",
        "job",
        "lease",
        "message",
        "progress",
        "progress_dropped",
        "published",
        "started",
        "trace",
    )

    def __init__(self, job: Job, lease: Lease, trace: JobTrace, ctx: Context) -> None:
        self.job = job
        self.lease = lease
        self.trace = trace
        self.ctx = ctx
        self.started = time.time()
        self.progress = 0.0
        self.message = ""
        self.published = False
        self.progress_dropped = False  # a progress report was dropped (warned once)

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


log = logging.getLogger("aqw.worker")

#: A running job enters the queue's running index (what ``aqw status`` and the monitor list)
#: once it has run this long, or reports progress, so the many short jobs cost nothing there.
STATE_AFTER = 0.5

#: Seconds a progress report may take, retries through a lost connection included, before
#: it is dropped: long enough to ride out a blip or a restart, short enough not to hold up
#: the handler that awaits it.
PROGRESS_WITHIN = 2.0

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
    its state is published (``broker.records.set_running_state``), which lists it among the running
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
        await self._broker.records.set_running_state(run.job.id, run.state(self._worker))

    async def report_progress(
        self, job_id: str, fraction: float, message: str, detail: str | None = None
    ) -> None:
        """Record a running job's progress and publish its state at once, best effort: a
        lost connection is retried for up to ``PROGRESS_WITHIN`` seconds, then the report is
        dropped with one warning per job (the next report writes the latest progress
        anyway). Nothing but a stop of the handler itself gets out of here: a progress
        report never fails a job."""
        run = self._runs.get(job_id)
        if run is None:
            return
        run.progress, run.message = fraction, message
        stream = self._broker.progress
        if stream is not None:  # its readers (``app.progress``), best effort
            await self._stream(stream, run, fraction, message, detail)
        deadline = time.monotonic() + PROGRESS_WITHIN
        delay = 0.05
        while True:
            try:
                async with asyncio.timeout(max(deadline - time.monotonic(), 0.01)):
                    await self.publish(run)
                return
            except self._broker.transient_errors as exc:
                error: BaseException = exc
            except TimeoutError as exc:  # our deadline (also a transient error)
                error = exc
            except Exception as exc:  # a damaged record, a script error: no retry
                self._drop_progress(run, exc)
                return
            if time.monotonic() + delay >= deadline:
                self._drop_progress(run, error)
                return
            await asyncio.sleep(delay)
            delay *= 2

    async def _stream(
        self, stream: ProgressStream, run: RunningJob, fraction: float, msg: str, detail: str | None
    ) -> None:
        update = {"fraction": repr(fraction), "message": msg}
        if detail is not None:
            update["detail"] = detail
        try:
            async with asyncio.timeout(PROGRESS_WITHIN):
                await stream.publish(run.job.id, update)
        except Exception as exc:  # a lost connection, a damaged key: the update is dropped
            self._drop_progress(run, exc)

    def _drop_progress(self, run: RunningJob, error: BaseException) -> None:
        level = logging.DEBUG if run.progress_dropped else logging.WARNING
        run.progress_dropped = True
        log.log(
            level,
            "job %s (%s): its progress could not be written (%r); dropped, the job goes on "
            "(later reports are dropped at DEBUG)",
            run.job.id,
            run.job.task,
            error,
            extra=job_fields(run.job),
        )
