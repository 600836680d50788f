"""The last step of a job's path: ack, retry later, dead-letter or give back, each one atomic
broker step that also releases the job's lease and refuses when another holder owns the job.

A lost connection is retried (``with_retries``) within the longest lease TTL; a step that is
refused (another holder took the job over) is counted as a lost lease, never retried.

Each failed attempt is logged once (logger ``aqw.worker``): a WARNING with its traceback when
it will be retried, an ERROR naming the DLQ entry when it is dead-lettered; the traceback is
redacted as the DLQ's is and bounded (``LOG_TRACEBACK_CHARS``). Every record about a job
carries its ``job_id``, ``task`` and ``attempt`` as ``extra`` fields (``job_fields``), and
each finished attempt's its ``outcome`` and ``duration_ms`` (``_log_lines.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from ..brokers.base import Broker, Delivery, Failure, Finish
from ..context import job_fields
from ..errors import Retry
from ..job import Job
from ..lease import Lease
from ..task import Task
from ..telemetry import ATTR_DLQ_REASON, ATTR_RETRY_DELAY, JobTrace, Telemetry
from ._attempts import failure_of, next_attempt
from ._backoff import with_retries
from ._failures import ErrorTracker, RunawayGuard, fingerprint
from ._handler import Outcome, describe
from ._log_lines import (
    CANCELLED,
    SUCCEEDED,
    Hints,
    attempt_fields,
    log_crashed,
    log_dead,
    log_failed,
    log_retrying,
)
from ._running import WorkerStats
from ._stats import SlidingStats

log = logging.getLogger("aqw.worker")


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
        hints: how the copy-paste commands of its log lines name the app.
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
        hints: Hints | None = None,
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
        self.hints = hints or Hints(None)
        #: When the latest retry this worker made is due (epoch seconds; 0: none yet).
        self.retry_due = 0.0
        #: The finish of a success that keeps no result, by record lifetime (immutable).
        self._succeeded: dict[float, Finish] = {}

    async def settle(
        self,
        task: Task[Any],
        delivery: Delivery,
        job: Job,
        lease: Lease,
        outcome: Outcome,
        jt: JobTrace,
    ) -> None:
        """Act on the handler's outcome: ack (or skip), retry with backoff, dead-letter, or
        end a cancelled job."""
        if outcome.kind in ("ok", "skip"):
            await self._ack(task, delivery, job, lease, outcome, jt)
            return
        if outcome.kind == "cancelled":
            await self.end_unrun(task, delivery, job, lease, CANCELLED, jt, outcome.duration)
            return
        error = outcome.error
        assert error is not None
        self.stats.failed += 1
        self.window.count("failed", task.name)
        self.tel.count("aqw.jobs.failed", task.name)
        code = getattr(task.fn, "__code__", None)
        if isinstance(error, Retry):  # a requested retry is not an error
            fp = fingerprint(error, code)
        else:
            fp = self.errors.record(error, task.name, code)
        policy = task.options.retry
        if outcome.kind == "retry" and policy.retries_left(job.attempt):
            delay = outcome.delay
            if delay is None:
                delay = policy.delay(job.attempt) * self.runaway.delay_factor(task.name)
            log_retrying(job, error, delay, outcome.duration, self.redact)
            failure = self.failure(job, error, fingerprint=fp)
            if await self.retry(delivery, job, delay, lease, failure):
                jt.settled("retry", {ATTR_RETRY_DELAY: delay})
                self.tel.count("aqw.jobs.retried", task.name)
                self.runaway.record(task.name, True)
            else:
                self.lost(job)
            return
        self.runaway.record(task.name, False)
        if not task.options.dead_letter:
            await self._fail(task, delivery, job, lease, error, fp, jt, outcome.duration)
            return
        keep_for = task.options.keep_for
        entry = await self.dead_letter(
            delivery, job, error, lease, fingerprint=fp, keep_for=keep_for, ran=outcome.duration
        )
        if entry is not None:
            jt.settled("dead_letter", {ATTR_DLQ_REASON: describe(error)})

    async def _ack(
        self,
        task: Task[Any],
        delivery: Delivery,
        job: Job,
        lease: Lease,
        outcome: Outcome,
        jt: JobTrace,
    ) -> None:
        kind = outcome.kind
        result, note = None, ""
        if kind == "ok" and task.options.keep_result:
            result, note = task.results.dump(outcome.value, task.options.max_result_bytes)
            if note:
                log.warning(
                    "job %s (%s): %s; it succeeded, its result is not kept",
                    job.id,
                    job.task,
                    note,
                    extra=job_fields(job),
                )
        keep = task.options.keep_for
        finish = self._succeeded.get(keep) if result is None and not note else None
        if finish is None:
            finish = Finish("succeeded", keep, result, note)
            if result is None and not note:  # most jobs: this finish is reused
                self._succeeded[keep] = finish
        ack = partial(self.broker.ack, delivery, job, lease, self.record_ttl, finish)
        if not await self.step(ack):
            self.lost(job)
            return
        jt.settled("ack" if kind == "ok" else "skip")
        if kind == "skip":
            self.stats.duplicates_skipped += 1
            self.window.count("skipped", task.name)
            self.tel.count("aqw.jobs.duplicates_skipped", task.name)
            log.info(
                "job %s (%s) already completed under key %r; skipped",
                job.id,
                job.task,
                job.key,
                extra=attempt_fields(job, SUCCEEDED, 0.0),
            )
        else:
            self.stats.processed += 1
            self.window.count("processed", task.name)
            if self.tel.metering:
                self.tel.count("aqw.jobs.processed", task.name)
            self.runaway.record(task.name, False)

    async def _fail(
        self,
        task: Task[Any],
        delivery: Delivery,
        job: Job,
        lease: Lease,
        error: BaseException,
        fp: str,
        jt: JobTrace,
        ran: float,
    ) -> None:
        """A job of a task that keeps no dead letters failed for good: ack it as failed
        (``ran``: seconds its handler ran)."""
        failure = self.failure(job, error, fingerprint=fp)
        finish = Finish("failed", task.options.keep_for, failure=failure)
        ack = partial(self.broker.ack, delivery, job, lease, 0.0, finish)
        if not await self.step(ack):
            self.lost(job)
            return
        jt.settled("ack", {ATTR_DLQ_REASON: describe(error)})
        log_failed(job, failure.error, error, ran, self.redact)

    async def end_unrun(
        self,
        task: Task[Any] | None,
        delivery: Delivery,
        job: Job,
        lease: Lease | None,
        state: str,
        jt: JobTrace | None = None,
        ran: float = 0.0,
    ) -> bool:
        """End a job that was cancelled (before or while running) or expired before it
        started: ack it with that state, never retried, never dead-lettered (``ran``:
        seconds its handler ran, 0 when it never started)."""
        keep_for = task.options.keep_for if task is not None else Finish().keep_for
        ack = partial(self.broker.ack, delivery, job, lease, 0.0, Finish(state, keep_for))
        if not await self.step(ack):
            self.lost(job)
            return False
        if jt is not None:
            jt.settled(state)
        if state == "expired":
            self.stats.expired += 1
            how = "expired before it started; not run"
        else:
            self.stats.cancelled += 1
            how = "cancelled while running" if lease is not None else "cancelled; not run"
        self.tel.count(f"aqw.jobs.{state}", job.task)
        if log.isEnabledFor(logging.INFO):
            log.info("job %s (%s) %s", job.id, job.task, how, extra=attempt_fields(job, state, ran))
        return True

    async def retry(
        self,
        delivery: Delivery,
        job: Job,
        delay: float,
        lease: Lease | None,
        failure: Failure | None = None,
    ) -> bool:
        """Replace the delivery with the job's next attempt, due in ``delay`` seconds."""
        due = time.time() + delay
        step = partial(self.broker.retry, delivery, next_attempt(job), due, lease, failure)
        ok = await self.step(step)
        if ok:
            self.stats.retried += 1
            self.window.count("retried", job.task)
            self.retry_due = max(self.retry_due, due)
        return ok

    async def dead_letter(
        self,
        delivery: Delivery,
        job: Job | None,
        error: BaseException,
        lease: Lease | None = None,
        *,
        payload_error: bool = False,
        fingerprint: str = "",
        keep_for: float | None = None,
        ran: float = 0.0,
    ) -> str | None:
        """Move the delivery to the DLQ with the reason (``job`` None: it did not decode) and
        log it at ERROR with the new entry's id (``ran``: seconds the handler ran, 0 when it
        never started); that id, or None when the step was refused (counted and logged as a
        lost lease) or could not be sent in time."""
        failure = self.failure(job, error, payload_error, fingerprint)
        reason = failure.error
        attempts = job.attempt if job else delivery.delivery_count
        keep = keep_for if keep_for is not None else Finish().keep_for
        entry: list[str] = []

        async def send() -> bool:
            got = await self.broker.dead_letter(delivery, job, failure, attempts, lease, keep)
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
        self.window.count("dead", job.task if job else "")
        self.tel.count("aqw.jobs.dead_lettered", job.task if job else None)
        show = self.hints.command(f"dlq show {entry[0]}")
        log_dead(delivery.id, job, reason, entry[0], show, error, ran, self.redact)
        return entry[0]

    async def give_back(self, delivery: Delivery, job: Job | None = None) -> None:
        """Hand an unfinished delivery back for immediate redelivery (a shutdown, or a lease
        that could not be taken): the same attempt, no attempt spent."""
        give = asyncio.ensure_future(self.broker.give_back(delivery, None, job))
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
        log_crashed(delivery.id, job, exc, retrying, self.redact)
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

    def step(self, step: Callable[[], Awaitable[bool]]) -> Awaitable[bool]:
        """Run one settle step, riding out a lost connection within ``within`` seconds."""
        return with_retries(step, within=self.within, transient=self.broker.transient_errors)

    def failure(
        self,
        job: Job | None,
        error: BaseException,
        payload_error: bool = False,
        fingerprint: str = "",
    ) -> Failure:
        """What is recorded of a failed attempt (``failure_of``)."""
        return failure_of(job, error, self.worker, self.redact, payload_error, fingerprint)
