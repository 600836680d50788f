"""The last step of a job's path: ack, retry later, dead-letter or give back, each one atomic
broker step that also releases the job's lease and refuses when another holder owns the job.

A lost connection is retried (``with_retries``) within the longest lease TTL; a step that is
refused (another holder took the job over) is counted as a lost lease, never retried.

Each failed attempt is logged once (logger ``aqw.worker``): a WARNING with its traceback when
it will be retried, an ERROR naming the DLQ entry when it is dead-lettered; the traceback is
redacted as the DLQ's is and bounded (``LOG_TRACEBACK_CHARS``). Every record about a job
carries its ``job_id``, ``task`` and ``attempt`` as ``extra`` fields (``job_fields``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from .._redact import redact_traceback, user_traceback
from ..brokers.base import Broker, Delivery, Failure
from ..context import job_fields
from ..errors import Retry
from ..job import Job
from ..lease import Lease
from ..task import Task
from ..telemetry import ATTR_DLQ_REASON, ATTR_RETRY_DELAY, JobTrace, Telemetry
from ._backoff import with_retries
from ._failures import ErrorTracker, RunawayGuard
from ._handler import Outcome, describe
from ._running import WorkerStats
from ._stats import SlidingStats

log = logging.getLogger("aqw.worker")

#: The header a retried job carries: when it first failed (seconds since the epoch).
FIRST_FAILURE = "aqw-first-failure"

#: Longest traceback a log line carries (its last characters: the innermost frames).
LOG_TRACEBACK_CHARS = 4000


def first_failure(job: Job) -> float:
    """When the job first failed (seconds since the epoch), or 0.0: the header is written by
    this worker but travels with the message, so it is read leniently."""
    raw = job.headers.get(FIRST_FAILURE)
    try:
        value = float(raw) if raw else 0.0
    except ValueError:
        return 0.0
    # Past 1e11 s (the year 5138) it is not a time this worker wrote.
    return value if math.isfinite(value) and 0 < value < 1e11 else 0.0


def next_attempt(job: Job) -> Job:
    """The job's next attempt, remembering when it first failed."""
    headers = dict(job.headers)
    if not first_failure(job):
        headers[FIRST_FAILURE] = repr(time.time())
    return job.model_copy(update={"attempt": job.attempt + 1, "headers": headers})


class Settler:
    """Settles the jobs of one worker and keeps its counters.

    Args:
        broker: the queue.
        worker: the worker's name, recorded with dead-lettered jobs.
        stats, window, errors, runaway: the worker's counters, recent rates, error
            fingerprints and retry-runaway guard.
        tel: the queue's telemetry.
        record_ttl: seconds a keyed job's completion record lives.
        redact: keep payload values out of recorded tracebacks.
        within: seconds a settle step may be retried through a lost connection.
    """

    def __init__(
        self,
        broker: Broker,
        *,
        worker: str,
        stats: WorkerStats,
        window: SlidingStats,
        errors: ErrorTracker,
        runaway: RunawayGuard,
        tel: Telemetry,
        record_ttl: float,
        redact: bool,
        within: float,
    ) -> None:
        self.broker = broker
        self.worker = worker
        self.stats = stats
        self.window = window
        self.errors = errors
        self.runaway = runaway
        self.tel = tel
        self.record_ttl = record_ttl
        self.redact = redact
        self.within = within

    async def settle(
        self,
        task: Task[Any],
        delivery: Delivery,
        job: Job,
        lease: Lease,
        outcome: Outcome,
        jt: JobTrace,
    ) -> None:
        """Act on the handler's outcome: ack (or skip), retry with backoff, or dead-letter."""
        if outcome.kind in ("ok", "skip"):
            await self._ack(task, delivery, job, lease, outcome.kind, jt)
            return
        error = outcome.error
        assert error is not None
        self.stats.failed += 1
        self.window.count("failed")
        self.tel.count("aqw.jobs.failed", task.name)
        if not isinstance(error, Retry):  # a requested retry is not an error
            self.errors.record(error, task.name, getattr(task.fn, "__code__", None))
        policy = task.options.retry
        if outcome.kind == "retry" and policy.retries_left(job.attempt):
            delay = outcome.delay
            if delay is None:
                delay = policy.delay(job.attempt) * self.runaway.delay_factor(task.name)
            log.warning(
                "job %s (%s) attempt %d failed: %s; retrying in %.2fs%s",
                job.id,
                job.task,
                job.attempt,
                describe(error),
                delay,
                "" if isinstance(error, Retry) else self.log_traceback(error),
                extra=job_fields(job),
            )
            if await self.retry(delivery, job, delay, lease):
                jt.settled("retry", {ATTR_RETRY_DELAY: delay})
                self.tel.count("aqw.jobs.retried", task.name)
                self.runaway.record(task.name, True)
            else:
                self.lost(job)
            return
        self.runaway.record(task.name, False)
        if await self.dead_letter(delivery, job, error, lease) is not None:
            jt.settled("dead_letter", {ATTR_DLQ_REASON: describe(error)})

    async def _ack(
        self, task: Task[Any], delivery: Delivery, job: Job, lease: Lease, kind: str, jt: JobTrace
    ) -> None:
        ack = partial(self.broker.ack, delivery, job, lease, self.record_ttl)
        if not await self.step(ack):
            self.lost(job)
            return
        jt.settled("ack" if kind == "ok" else "skip")
        if kind == "skip":
            self.stats.duplicates_skipped += 1
            self.window.count("skipped")
            self.tel.count("aqw.jobs.duplicates_skipped", task.name)
            log.info(
                "job %s (%s) already completed under key %r; skipped",
                job.id,
                job.task,
                job.key,
                extra=job_fields(job),
            )
        else:
            self.stats.processed += 1
            self.window.count("processed")
            self.tel.count("aqw.jobs.processed", task.name)
            self.runaway.record(task.name, False)

    async def retry(self, delivery: Delivery, job: Job, delay: float, lease: Lease | None) -> bool:
        """Replace the delivery with the job's next attempt, due in ``delay`` seconds."""
        step = partial(self.broker.retry, delivery, next_attempt(job), time.time() + delay, lease)
        ok = await self.step(step)
        if ok:
            self.stats.retried += 1
            self.window.count("retried")
        return ok

    async def dead_letter(
        self,
        delivery: Delivery,
        job: Job | None,
        error: BaseException,
        lease: Lease | None = None,
        *,
        payload_error: bool = False,
    ) -> str | None:
        """Move the delivery to the DLQ with the reason (``job`` None: it did not decode) and
        log it at ERROR with the new entry's id; that id, or None when the step was refused
        (counted and logged as a lost lease) or could not be sent in time."""
        reason = describe(error, payload_error)
        failure = Failure(
            error_type=type(error).__name__,
            error=reason,
            traceback=self._traceback(error),
            worker=self.worker,
            first_failed_at=first_failure(job) if job else 0.0,
            failed_at=time.time(),
        )
        attempts = job.attempt if job else delivery.delivery_count
        entry: list[str] = []

        async def send() -> bool:
            got = await self.broker.dead_letter(delivery, job, failure, attempts, lease)
            if got is not None:
                entry.append(got)
            return got is not None

        if not await self.step(send) or not entry:
            if job is not None:
                self.lost(job, f" (not dead-lettered: {reason})")
            else:
                log.warning("message %s (undecodable): not dead-lettered: %s", delivery.id, reason)
            return None
        self.stats.dead += 1
        self.window.count("dead")
        self.tel.count("aqw.jobs.dead_lettered", job.task if job else None)
        if job is None:
            log.error(
                "message %s (undecodable) dead-lettered: %s; DLQ entry %s",
                delivery.id,
                reason,
                entry[0],
                extra={"dlq_entry": entry[0]},
            )
        else:
            log.error(
                "job %s (%s) attempt %d dead-lettered: %s; DLQ entry %s (aqw dlq show %s)%s",
                job.id,
                job.task,
                job.attempt,
                reason,
                entry[0],
                entry[0],
                self.log_traceback(error),
                extra={**job_fields(job), "dlq_entry": entry[0]},
            )
        return entry[0]

    async def give_back(self, delivery: Delivery) -> None:
        """Hand an unfinished delivery back for immediate redelivery (a shutdown, or a lease
        that could not be taken): the same attempt, no attempt spent."""
        give = asyncio.ensure_future(self.broker.requeue(delivery, None))
        try:
            if await asyncio.shield(give):
                self.stats.requeued += 1
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            log.warning(
                "could not hand back %s (%r); it is redelivered after its lease", delivery.id, exc
            )

    async def crashed(
        self,
        delivery: Delivery,
        job: Job | None,
        task: Task[Any] | None,
        exc: Exception,
        lease: Lease | None,
    ) -> None:
        """The job path itself failed (a bug, damaged data, a backend error that is not a
        lost connection): retry the job with backoff while it has retries left, else
        dead-letter it with the reason. A delivery is never left pending to fail again."""
        retrying = (
            job is not None and task is not None and task.options.retry.retries_left(job.attempt)
        )
        log.error(
            "job path failed for message %s: %s%s",
            delivery.id,
            describe(exc),
            self.log_traceback(exc) if retrying else "",  # else the dead-letter line has it
            extra=job_fields(job) if job is not None else None,
        )
        try:
            if retrying:
                assert job is not None and task is not None
                await self.retry(delivery, job, task.options.retry.delay(job.attempt), lease)
                return
            await self.dead_letter(delivery, job, exc, lease)
        except Exception as again:
            log.error(
                "could not settle message %s (%s); it is redelivered after its lease",
                delivery.id,
                describe(again),
                extra=job_fields(job) if job is not None else None,
            )

    def lost(self, job: Job, why: str = "") -> None:
        """A settle step was refused: another holder took the job over."""
        self.stats.lease_lost += 1
        log.warning(
            "job %s (%s) attempt %d: its lease passed to another holder before settling%s",
            job.id,
            job.task,
            job.attempt,
            why,
            extra=job_fields(job),
        )

    async def step(self, step: Callable[[], Awaitable[bool]]) -> bool:
        """Run one settle step, riding out a lost connection within ``within`` seconds."""
        return await with_retries(step, within=self.within, transient=self.broker.transient_errors)

    def log_traceback(self, error: BaseException) -> str:
        """``error``'s traceback for a log line, after a newline: redacted as the DLQ's is,
        cut to its last ``LOG_TRACEBACK_CHARS``; empty for an error that was never raised."""
        if error.__traceback__ is None:
            return ""
        text = self._traceback(error).rstrip("\n")
        if len(text) > LOG_TRACEBACK_CHARS:
            text = "... (cut)\n" + text[-LOG_TRACEBACK_CHARS:]
        return "\n" + text

    def _traceback(self, error: BaseException) -> str:
        if self.redact:
            return redact_traceback(error, limit=8000)
        return user_traceback(error)[-8000:]
