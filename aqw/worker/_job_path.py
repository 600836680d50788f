"""One delivery, from bytes to a settle, as a short sequence of named steps:

``decode`` -> find the task -> check its size and delivery count -> validate the payload ->
``take_lease`` -> run the handler under the lease and the task's timeout (``_handler.py``)
-> ``Settler.settle`` (``_settle.py``). A message that cannot become a job is dead-lettered
with the reason, and nothing escapes: an unexpected error ends in a retry or the DLQ.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import Status, StatusCode

from ..brokers.base import Broker, Delivery
from ..brokers.batching import BATCH_INFO_HEADER
from ..context import Context, ContextHost, job_fields
from ..errors import (
    JobCancelled,
    LeaseLost,
    LeaseUnavailable,
    MalformedJob,
    PayloadTooLarge,
    RateLimited,
    StaleStart,
    TooManyDeliveries,
    UnknownTask,
)
from ..flow import debounce_cap
from ..job import Job
from ..lease import Lease, LeaseKeeper
from ..task import Task
from ..telemetry import Telemetry, now_ns, record_batch
from ._backoff import Backoff
from ._deferring import AdaptiveRates, defer, has_cap, start_backend
from ._handler import Outcome, describe, run_handler
from ._log_lines import SUCCEEDED, attempt_fields
from ._needs import check_limits
from ._running import RunningJob, RunningJobs, WorkerStats
from ._settle import Settler
from ._stats import SlidingStats

if TYPE_CHECKING:  # the cache's module loads redis-py
    from ..cache import Cache

log = logging.getLogger("aqw.worker")

#: Bytes a received message may exceed its payload cap by: a retry adds a header and may
#: lengthen the attempt number, so a job accepted just under the cap must still run.
RECEIPT_SLACK = 1024


class JobPath:
    """Runs deliveries of one worker. Built by the worker, which owns every part it uses."""

    def __init__(
        self,
        *,
        broker: Broker,
        tasks: Mapping[str, Task[Any]],
        payload_limit: Callable[[str | None], int | None],
        cache: Cache | None,
        host: ContextHost,
        tel: Telemetry,
        keeper: LeaseKeeper,
        settler: Settler,
        running: RunningJobs,
        settle_started: Callable[[asyncio.Task[Any], bool], None],
        stats: WorkerStats,
        window: SlidingStats,
        stopping: asyncio.Event,
        spawn: Callable[[Awaitable[Any]], None],
    ) -> None:
        self.broker = broker
        self.tasks = tasks
        self.adaptive = AdaptiveRates()  # the tasks' adaptive rate limits (aqw.Adaptive)
        self.payload_limit = payload_limit
        self.cache = cache
        self.host = host
        self.tel = tel
        self.keeper = keeper
        self.settler = settler
        self.running = running
        self.settle_started = settle_started
        self.stats = stats
        self.window = window
        self.stopping = stopping
        self.spawn = spawn
        check_limits(broker, tasks)  # a limit the broker cannot hold: refused at start
        #: The tasks with a per-key cap (a debounced job has one of its own, too).
        self.capped = {name for name, t in tasks.items() if has_cap(t)}
        caps = [payload_limit(None), *(payload_limit(name) for name in tasks)]
        #: The largest message any task accepts: bigger ones are refused before parsing.
        self.receipt_cap = None if None in caps else max(c for c in caps if c is not None)

    async def process(self, delivery: Delivery) -> None:
        """Run one delivery to its settle."""
        job: Job | None = None
        try:
            job = self.decode(delivery)
            if job is not None:
                await self._run(delivery, job)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            task = self.tasks.get(job.task) if job is not None else None
            await self.settler.crashed(delivery, job, task, exc, None)

    def decode(self, delivery: Delivery) -> Job | None:
        """The delivery's job, or None when it cannot be one (dead-lettered with the reason,
        in the background: the job slot is free at once)."""
        try:
            cap = self.receipt_cap
            if cap is not None and len(delivery.data) > cap + RECEIPT_SLACK:
                raise PayloadTooLarge("(any)", len(delivery.data), cap, where=" (as received)")
            return Job.decode(delivery.data)
        except (MalformedJob, PayloadTooLarge) as exc:
            self.stats.malformed += 1
            log.error("message %s is malformed: %s", delivery.id, exc)
            self.spawn(self.settler.dead_letter(delivery, None, exc))
            return None

    async def _run(self, delivery: Delivery, job: Job) -> None:
        task = self.tasks.get(job.task)
        refusal = self._refusal(delivery, job, task)
        if refusal is not None:
            await self.settler.dead_letter(delivery, job, refusal)
            return
        assert task is not None
        try:
            payload = task.codec.load(job.payload)
        except Exception as exc:  # a validator may raise anything: the payload is unusable
            await self.settler.dead_letter(delivery, job, exc, payload_error=True)
            return
        if job.expired():
            await self.settler.end_unrun(task, delivery, job, None, "expired")
            return
        ttl, window = task.options.lease_ttl, self.broker.delivery_window
        lease = Lease(
            start_backend(self.broker, task, job, payload, delivery),
            self.broker.job_lease_key(job),
            ttl=ttl,
            # a delivery window shorter than the lease: renewed (kept alive) within it
            renew_every=window / 3 if window is not None and window < ttl else None,
            keep_alive=partial(self._keep_alive, delivery, job.id),
            keeper=self.keeper,
        )
        tel = self.tel
        jt = tel.job(job, delivery.received)
        if tel.metering:
            tel.observe("aqw.job.wait", max(0.0, time.time() - job.enqueued_at), job.task)
            renewed, lost = tel.lease_counters(job.task)
            lease.on_renewed(renewed)
            lease.on_lost(lost)
            if BATCH_INFO_HEADER in job.headers:  # a batch's callback: its batch's metrics
                record_batch(tel, job)
        run = RunningJob(job, lease, jt, Context(job, lease, self.host, delivery))
        error: BaseException | None = None
        try:
            try:
                outcome = await self._run_leased(delivery, job, task, payload, lease, run)
            except asyncio.CancelledError:  # a shutdown: hand it back for immediate redelivery
                jt.settled("requeue")
                await self.settler.give_back(delivery, job)
                raise
            if outcome is None:
                return
            error = outcome.error
            current = asyncio.current_task()
            if current is not None:
                # finished: not cancelled; its slot goes to the next job unless it holds a
                # per-key cap (the next job of its key would be refused until it settles)
                capped = task.name in self.capped or (job.key and debounce_cap(job))
                self.settle_started(current, not capped)
            if isinstance(error, RateLimited):  # an upstream's 429: later, no attempt spent
                limited, error = error, None
                if task.options.flow.floor is not None:  # an adaptive limit: lower it
                    await self.adaptive.lower(self.broker, task)
                await defer(self.settler, delivery, job, lease, limited, jt)
                return
            await self.settler.settle(task, delivery, job, lease, outcome, jt)
        except LeaseLost as exc:
            self.stats.lease_lost += 1
            error = exc
            log.warning(
                "job %s (%s) attempt %d: %s; not acknowledged",
                job.id,
                job.task,
                job.attempt,
                exc,
                extra=job_fields(job),
            )
        except Exception as exc:
            error = exc
            await self.settler.crashed(delivery, job, task, exc, lease if lease.token else None)
        finally:
            self.running.finish(run)
            jt.end(error)

    def _refusal(self, delivery: Delivery, job: Job, task: Task[Any] | None) -> Exception | None:
        """Why this job must go straight to the DLQ, or None."""
        if task is None:
            known = ", ".join(sorted(self.tasks))
            return UnknownTask(f"unknown task {job.task!r} (known: {known})")
        limit = self.payload_limit(job.task)
        if limit is not None and len(delivery.data) > limit + RECEIPT_SLACK:
            return PayloadTooLarge(job.task, len(delivery.data), limit, where=" (as received)")
        if delivery.delivery_count > task.options.max_deliveries:
            return TooManyDeliveries(
                f"delivered {delivery.delivery_count} times without being settled "
                "(the worker may crash or be killed while running it)"
            )
        return None

    async def _run_leased(
        self,
        delivery: Delivery,
        job: Job,
        task: Task[Any],
        payload: Any,
        lease: Lease,
        run: RunningJob,
    ) -> Outcome | None:
        """The handler's outcome under the job's lease; None when another holder has it."""
        jt = run.trace
        lease_started = now_ns() if jt.timed else 0
        try:
            taken = await self.take_lease(lease, delivery)
        except JobCancelled:  # cancelled before it started: end it, unrun
            await self.settler.end_unrun(task, delivery, job, None, "cancelled", jt)
            return None
        except StaleStart as stale:  # not ours any more, or ended: nothing to run or settle
            self.stats.stale_starts += 1
            jt.lease_refused(lease_started)
            log.info("job %s (%s) attempt %d: %s", job.id, job.task, job.attempt, stale)
            return None
        except RateLimited as limited:  # a rate limit or per-key cap: wait, no attempt spent
            await defer(self.settler, delivery, job, None, limited, jt)
            return None
        if not taken:
            if taken is False:  # None: handed back after a lost connection, not refused
                self.stats.lease_busy += 1
                jt.lease_refused(lease_started)
            return None
        if lease.expires_in <= 0:  # paused past the lease while it was taken: run nothing
            await lease.release()
            raise LeaseLost(lease.key, "the lease expired before the job started")
        async with lease:
            jt.lease_acquired(lease, lease_started)
            self.running.add(run)
            if job.key is not None and await self.broker.is_completed(job):
                outcome = Outcome("skip")
            else:
                outcome = await self._handle(run, task, payload)
            lease.hand_over()
        return outcome

    async def _handle(self, run: RunningJob, task: Task[Any], payload: Any) -> Outcome:
        job, jt = run.job, run.trace
        if log.isEnabledFor(logging.DEBUG):  # the fields cost a dict per job
            log.debug(
                "job %s (%s) attempt %d started",
                job.id,
                job.task,
                job.attempt,
                extra=job_fields(job),
            )
        began = time.perf_counter()
        with jt.handler() as span:
            outcome = await run_handler(task, payload, run.ctx)
            if outcome.kind == "ok" and task.options.invalidates is not None:
                outcome = await self._invalidate(task, payload)
            if outcome.error is not None and span is not None:
                self.tel.record_error(span, outcome.error)
                span.set_status(Status(StatusCode.ERROR, describe(outcome.error)))
        outcome.duration = elapsed = time.perf_counter() - began
        if outcome.kind == "ok" and log.isEnabledFor(logging.INFO):
            log.info(
                "job %s (%s) attempt %d succeeded in %.1f ms",
                job.id,
                job.task,
                job.attempt,
                elapsed * 1000,
                extra=attempt_fields(job, SUCCEEDED, elapsed),
            )
        self.window.duration(elapsed, job.task)
        if self.tel.metering:
            self.tel.observe("aqw.job.duration", elapsed, job.task)
        if outcome.kind == "ok" and task.options.flow.floor is not None:
            await self.adaptive.grow(self.broker, task)  # an adaptive limit grows back
        return outcome

    async def take_lease(self, lease: Lease, delivery: Delivery) -> bool | None:
        """Acquire the job's lease: True when taken, False when another holder has the job.
        The start itself checks, in the same step, that ``delivery`` is still this
        consumer's and its job has not ended (``StaleStart`` otherwise, raised through: after
        a pause another worker may have run it). A lost connection is retried with backoff
        (no attempt is spent; a retried acquire by the same token takes the key again) until
        the lease's TTL, then the delivery is handed back for immediate redelivery: None."""
        give_up = asyncio.get_running_loop().time() + lease.ttl
        backoff: Backoff | None = None  # made once a try fails: most jobs need none
        while True:
            try:
                await lease.acquire()
                break
            except LeaseUnavailable:
                return False
            except self.broker.transient_errors as exc:
                if asyncio.get_running_loop().time() >= give_up or self.stopping.is_set():
                    log.warning("job lease %r: %r; handing the job back", lease.key, exc)
                    await self.settler.give_back(delivery)
                    return None
                backoff = backoff or Backoff(0.05, 1.0)
                await asyncio.sleep(backoff.next())
        return True

    async def _keep_alive(self, delivery: Delivery, job_id: str) -> bool:
        """Run with each renewal of the job's lease (which also moves its record's lease
        expiry on): keep the delivery ours, and stop the handler when ``app.cancel`` asked
        for it (sent in the same round trip)."""
        alive, cancel = await asyncio.gather(
            self.broker.keep_alive(delivery), self.broker.records.cancel_requested(job_id)
        )
        if alive and cancel:
            self.running.cancel(job_id)
        return alive

    async def _invalidate(self, task: Task[Any], payload: Any) -> Outcome:
        """Invalidate the task's cache keys after its write and before its ack, so no stale
        entry is visible once the job is acknowledged; a failure reruns the job."""
        assert self.cache is not None
        try:
            keys = task.options.keys_to_invalidate(payload)
            if keys:
                await self.cache.invalidate(*keys)
        except Exception as exc:
            log.warning("task %s: invalidating its cache keys failed (%r)", task.name, exc)
            return Outcome("retry", exc)
        return Outcome("ok")
