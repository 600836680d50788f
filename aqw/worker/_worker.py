"""The event-loop runtime: fetch with backpressure, run each job under its lease, settle.

A job's path, step by step (``Worker._process``): decode the message, find its task,
validate its payload, take its lease, run the handler under the lease and the task's timeout,
then settle in one atomic broker step that also releases the lease: ack, retry later, or
dead-letter. A message that cannot become a job is dead-lettered with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import time
import traceback
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import Status, StatusCode

from .._ids import consumer_name
from .._redact import redact_traceback
from .._redis.keys import QueueKeys
from ..brokers.base import Delivery, Failure, QueueDepth
from ..context import Context
from ..errors import (
    BrokerUnavailable,
    ConfigError,
    LeaseLost,
    LeaseUnavailable,
    MalformedJob,
    PayloadTooLarge,
    Retry,
    TooManyDeliveries,
    UnknownTask,
)
from ..job import Job
from ..lease import Lease, LeaseKeeper
from ..telemetry import (
    ATTR_DLQ_REASON,
    ATTR_RETRY_DELAY,
    JobTrace,
    now_ns,
)
from ._backoff import TRANSIENT, Backoff, with_retries
from ._failures import ErrorTracker, RunawayGuard
from ._handler import Outcome, describe, run_handler
from ._heartbeat import report_stuck, stuck_jobs, summary
from ._locks import ResourceLock
from ._running import STATE_AFTER, RunningJob, WorkerStats
from ._stats import SlidingStats

if TYPE_CHECKING:
    from ..app import App
    from ..task import Task

log = logging.getLogger("aqw.worker")

FIRST_FAILURE = "aqw-first-failure"

#: Bytes a received message may exceed its payload cap by: a retry adds a header and may
#: lengthen the attempt number, so a job accepted just under the cap must still run.
RECEIPT_SLACK = 1024

#: In burst mode, delayed jobs due within this many seconds are waited for.
BURST_HORIZON = 10.0


def first_failure(job: Job) -> float:
    """When the job first failed (seconds since the epoch), or 0.0: the header is written by
    this worker but travels with the message, so it is read leniently."""
    raw = job.headers.get(FIRST_FAILURE)
    try:
        value = float(raw) if raw else 0.0
    except ValueError:
        return 0.0
    return value if math.isfinite(value) and value > 0 else 0.0


def next_attempt(job: Job) -> Job:
    """The job's next attempt, remembering when it first failed."""
    headers = dict(job.headers)
    if not first_failure(job):
        headers[FIRST_FAILURE] = repr(time.time())
    return job.model_copy(update={"attempt": job.attempt + 1, "headers": headers})


class Worker:
    """Runs an app's jobs in the current event loop. Use ``async with app.worker(...)`` to
    embed it (it runs in the background until the block exits), or ``run`` to run it
    until stopped (signal, ``request_stop``, or an empty queue in burst mode)."""

    def __init__(
        self,
        app: App,
        *,
        concurrency: int = 100,
        prefetch: int = 0,
        grace: float = 30.0,
        burst: bool = False,
        handle_signals: bool = False,
        name: str | None = None,
        heartbeat: float = 5.0,
    ) -> None:
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigError(f"worker concurrency must be an integer >= 1, got {concurrency!r}")
        if not isinstance(prefetch, int) or prefetch < 0:
            raise ConfigError(f"worker prefetch must be an integer >= 0, got {prefetch!r}")
        if grace < 0:
            raise ConfigError(f"worker grace must be >= 0 seconds, got {grace!r}")
        if heartbeat <= 0:
            raise ConfigError(f"worker heartbeat must be > 0 seconds, got {heartbeat!r}")
        self.app = app
        self.broker = app.broker
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.grace = grace
        self.burst = burst
        self.handle_signals = handle_signals
        self.name = name or consumer_name()
        self.stats = WorkerStats()
        self.errors = ErrorTracker(redact=app.redact_errors)
        self.runaway = RunawayGuard()
        self.keeper = LeaseKeeper()
        self.window = SlidingStats()
        self.heartbeat = heartbeat
        self._stuck_reported: set[str] = set()
        self.tel = app.telemetry
        self._depth: QueueDepth | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self.state = "idle"  # idle -> running -> stopping -> stopped
        self.started_at = 0.0
        self._in_flight = 0
        self._jobs: dict[asyncio.Task[None], str] = {}  # job task -> its delivery id
        self._settling: set[asyncio.Task[Any]] = set()
        self._running: dict[str, RunningJob] = {}
        self._buffer: deque[tuple[Delivery, float]] = deque()  # (delivery, buffered at)
        self._slot_free = asyncio.Event()
        self._stop = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        self._next_due: float | None = None
        self._idle_fetches = 0
        ttls = [app.lease_ttl, *(t.options.lease_ttl for t in app.tasks.values())]
        self._max_ttl = max(ttls)
        self._min_ttl = min(ttls)
        caps = [app.payload_limit(None), *(app.payload_limit(name) for name in app.tasks)]
        self._receipt_cap = None if None in caps else max(c for c in caps if c is not None)

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Jobs running now."""
        return self._in_flight

    def running_jobs(self) -> list[tuple[Job, float]]:
        """(job, started at) of every job running now."""
        return [(run.job, run.started) for run in self._running.values()]

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Connect and start consuming in the background."""
        if self.state != "idle":
            raise RuntimeError("a Worker can be started once")
        if not self.app.tasks:
            raise ConfigError("the app registers no tasks: nothing to run")
        try:
            await self.broker.connect()
        except TRANSIENT as exc:
            raise BrokerUnavailable(
                f"cannot reach the {self.broker.system} broker of queue {self.app.queue!r}: {exc}"
            ) from exc
        self.broker.expect_lease_ttl(self._max_ttl)
        await self.broker.start_consuming(self.name)
        self.state = "running"
        self.started_at = time.time()
        spawn = asyncio.get_running_loop().create_task
        self._loops = [
            spawn(self._fetch_loop(), name="aqw-fetch"),
            spawn(self._promote_loop(), name="aqw-promote"),
            spawn(self._reclaim_loop(), name="aqw-reclaim"),
            spawn(self._heartbeat_loop(), name="aqw-heartbeat"),
        ]
        if self.handle_signals:
            self._install_signal_handlers()
        self.tel.add_gauges(self._gauges)
        cache = self.app.cache
        if cache is not None and cache.on_event is None and self.tel.metering:
            cache.on_event = self.tel.cache_hook()
        log.info(
            "worker %s started: queue=%r concurrency=%d tasks=%s",
            self.name, self.app.queue, self.concurrency, ", ".join(sorted(self.app.tasks)),
        )  # fmt: skip

    async def run(self) -> None:
        """Run until stopped by a signal, ``request_stop``, or (burst) an empty queue."""
        await self.start()
        try:
            await self._stop.wait()
        finally:
            await self.stop()

    def request_stop(self) -> None:
        """Ask the worker to stop gracefully; ``run`` returns once it has."""
        self._stop.set()

    async def wait_stopped(self) -> None:
        """Wait until a stop is requested (signal, burst end or ``request_stop``)."""
        await self._stop.wait()

    async def stop(self, grace: float | None = None) -> None:
        """Stop fetching, let running jobs finish within ``grace`` seconds, then cancel the
        rest and hand them back for immediate redelivery. Nothing unfinished is acked."""
        if self.state in ("stopping", "stopped", "idle"):
            return
        self.state = "stopping"
        self._stop.set()
        grace = self.grace if grace is None else grace
        for task in self._loops:
            task.cancel()
        # Each loop also checks the stop flag: on Python 3.11 a cancellation that lands as
        # a socket send completes can be swallowed by the client, and the loop goes on.
        _, stuck = await asyncio.wait(self._loops, timeout=5.0)
        for task in stuck:
            log.warning("background loop %s did not stop; abandoning it", task.get_name())
        await self._give_back_buffer()
        try:  # a read cancelled above may already have taken entries for this consumer
            given = await self.broker.give_back_unstarted(set(self._jobs.values()))
            if given:
                log.info("handed back %d jobs fetched as the worker stopped", given)
        except TRANSIENT as exc:
            log.warning("could not hand back fetched jobs (%r); they are reclaimed later", exc)
        if self._jobs:
            log.info("waiting up to %.1fs for %d running jobs", grace, len(self._jobs))
            _, pending = await asyncio.wait(set(self._jobs), timeout=grace)
            if pending:
                await self._cancel_jobs(pending, grace)
        if self._background:  # e.g. dead-lettering a malformed message
            await asyncio.wait(set(self._background), timeout=5.0)
        await self.keeper.close()
        self.tel.remove_gauges(self._gauges)
        with contextlib.suppress(Exception):
            await self.broker.remove_heartbeat(self.name)
        if self.handle_signals:
            self._remove_signal_handlers()
        self.state = "stopped"
        log.info("worker %s stopped: %s", self.name, self.stats.as_dict())

    async def _cancel_jobs(self, pending: set[asyncio.Task[None]], grace: float) -> None:
        """Cancel jobs still running after the grace period (they hand themselves back for
        immediate redelivery), but let a job that is already settling finish its settle
        step: it is done, and cancelling it now would only make it run again."""
        running = {t for t in pending if t not in self._settling}
        log.warning("cancelling %d jobs still running after %.1fs", len(running), grace)
        deadline = time.monotonic() + self._max_ttl
        while pending and time.monotonic() < deadline:
            for task in pending:
                if task not in self._settling:
                    task.cancel()  # again each pass: a client may swallow one cancellation
            _, pending = await asyncio.wait(pending, timeout=1.0)
        if pending:
            log.error("%d jobs did not stop; abandoning them to redelivery", len(pending))

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._on_signal, sig)

    def _remove_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("received %s: stopping gracefully", sig.name)
        self._stop.set()

    # -- background loops ------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        backoff = Backoff()
        while not self._stop.is_set():
            free = self.concurrency - self._in_flight
            while free > 0 and self._buffer:
                self._start_buffered()
                free -= 1
            want = free + self.prefetch - len(self._buffer)
            if free <= 0 or want <= 0:
                self._slot_free.clear()
                await self._slot_free.wait()
                continue
            try:
                fetch_started = now_ns() if self.tel.tracing else 0
                deliveries = await self.broker.fetch(want, block=0.25 if self.burst else 2.0)
                if fetch_started and deliveries:
                    received = (fetch_started, now_ns())
                    for delivery in deliveries:
                        delivery.received = received
            except TRANSIENT as exc:
                delay = backoff.next()
                log.warning("fetch failed (%r); retrying in %.2fs", exc, delay)
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            for delivery in deliveries:
                if self._in_flight < self.concurrency:
                    self._start(delivery)
                else:
                    self._buffer.append((delivery, time.monotonic()))
            if self.burst:
                await self._check_burst_done(bool(deliveries))

    async def _check_burst_done(self, got_work: bool) -> None:
        if got_work or self._in_flight or self._buffer:
            self._idle_fetches = 0
            return
        self._idle_fetches += 1
        if self._idle_fetches < 2:
            return
        try:
            depth = await self.broker.depth()
        except TRANSIENT:
            return
        if depth.waiting or depth.in_flight:
            return
        if depth.delayed:
            try:
                wait = await self.broker.promote_due()
            except TRANSIENT:
                return
            if wait is None or wait < BURST_HORIZON:
                # Due soon (a retry, a delayed job: part of this burst), or just moved to
                # the queue by this very call: look again on the next pass.
                return
        if not self._buffer and not self._in_flight:
            log.info("burst: the queue is empty; stopping")
            self._stop.set()

    async def _promote_loop(self) -> None:
        backoff = Backoff()
        while not self._stop.is_set():
            try:
                wait = await self.broker.promote_due()
            except TRANSIENT as exc:
                delay = backoff.next()
                log.warning("moving due jobs failed (%r); retrying in %.2fs", exc, delay)
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            self._next_due = None if wait is None else time.time() + wait
            await asyncio.sleep(0.05 if wait is None else min(wait, 0.05))

    def _lease_ttl_of(self, job: Job | None) -> float:
        """The lease TTL a job runs under (the app's for one that does not decode)."""
        task = self.app.tasks.get(job.task) if job is not None else None
        return task.options.lease_ttl if task is not None else self.app.lease_ttl

    async def _reclaim_loop(self) -> None:
        """Take over jobs whose consumer stopped: each once its own lease has lapsed (the
        broker checks the lease key atomically with the claim), scanned several times per
        shortest lease TTL."""
        interval = min(max(self._min_ttl / 4, 0.1), 5.0)
        while not self._stop.is_set():
            await asyncio.sleep(interval)
            free = self.concurrency - self._in_flight - len(self._buffer)
            if free <= 0:
                continue
            try:
                deliveries = await self.broker.reclaim(free, self._lease_ttl_of, self._min_ttl)
            except TRANSIENT as exc:
                log.warning("reclaiming abandoned jobs failed (%r)", exc)
                continue
            if deliveries:
                log.info("reclaimed %d jobs abandoned by a stopped consumer", len(deliveries))
            for delivery in deliveries:
                if self._in_flight < self.concurrency:
                    self._start(delivery)
                else:
                    self._buffer.append((delivery, time.monotonic()))

    async def _heartbeat_loop(self) -> None:
        """Publish this worker's summary every ``heartbeat`` seconds; several times a second,
        publish the state of jobs that have run a while and watch for stuck jobs (running
        longer than twice their task's ``sla``)."""
        last_beat = 0.0
        while not self._stop.is_set():
            self._publish_due_states()
            report_stuck(self)
            now = time.monotonic()
            if now - last_beat >= self.heartbeat:
                last_beat = now
                try:
                    await self.broker.publish_heartbeat(
                        self.name, self.summary(), ttl=self.heartbeat * 3
                    )
                    if self.tel.metering:
                        self._depth = await self.broker.depth()
                except TRANSIENT as exc:
                    log.warning("could not publish the worker heartbeat (%r)", exc)
            await asyncio.sleep(min(self.heartbeat, STATE_AFTER / 2))

    def _gauges(self) -> list[tuple[str, float, dict[str, Any]]]:
        readings = [("aqw.worker.in_flight", float(self._in_flight),
                     {**self.tel._attrs(None), "aqw.worker": self.name})]  # fmt: skip
        if self._depth is not None:
            readings += self.tel.depth_readings(self._depth)
        return readings

    def summary(self) -> dict[str, Any]:
        """What this worker publishes in its heartbeat: state, counters, recent rates,
        duration quantiles, running and stuck jobs, and the most frequent errors."""
        return summary(self)

    def stuck_jobs(self) -> list[dict[str, Any]]:
        """Jobs running longer than twice their task's ``sla``."""
        return stuck_jobs(self)

    async def _give_back_buffer(self) -> None:
        while self._buffer:
            delivery, _ = self._buffer.popleft()
            with contextlib.suppress(Exception):
                await self.broker.requeue(delivery, None)

    # -- one job ---------------------------------------------------------------------------

    def _start(self, delivery: Delivery, waited: float = 0.0) -> None:
        self._in_flight += 1
        task = asyncio.get_running_loop().create_task(self._process(delivery, waited))
        self._jobs[task] = delivery.id
        task.add_done_callback(self._job_done)

    def _start_buffered(self) -> None:
        delivery, since = self._buffer.popleft()
        self._start(delivery, time.monotonic() - since)

    def _job_done(self, task: asyncio.Task[None]) -> None:
        self._jobs.pop(task, None)
        self._settling.discard(task)
        self._in_flight -= 1
        self._slot_free.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("job runner crashed", exc_info=task.exception())

    async def _process(self, delivery: Delivery, waited: float = 0.0) -> None:
        """One delivery, from bytes to a settle. Nothing escapes: an unexpected error ends
        in a retry or the dead-letter queue, never in a delivery left pending to fail again."""
        try:
            await self._run_job(delivery, waited)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._crashed(delivery, exc, None)

    async def _run_job(self, delivery: Delivery, waited: float) -> None:
        job = self._decode(delivery)
        if job is None:
            return
        task = self.app.tasks.get(job.task)
        if task is None:
            known = ", ".join(sorted(self.app.tasks))
            await self._dead_letter(
                delivery, UnknownTask(f"unknown task {job.task!r} (known: {known})")
            )
            return
        limit = self.app.payload_limit(job.task)
        if limit is not None and len(delivery.data) > limit + RECEIPT_SLACK:
            too_large = PayloadTooLarge(job.task, len(delivery.data), limit, where=" (as received)")
            await self._dead_letter(delivery, too_large)
            return
        if delivery.delivery_count > task.options.max_deliveries:
            reason = TooManyDeliveries(
                f"delivered {delivery.delivery_count} times without being settled "
                "(the worker may crash or be killed while running it)"
            )
            await self._dead_letter(delivery, reason)
            return
        try:
            payload = task.codec.load(job.payload)
        except Exception as exc:  # a validator may raise anything: the payload is unusable
            await self._dead_letter(delivery, exc, payload_error=True)
            return
        lease = Lease(
            self.broker.lease_backend(),
            self.broker.job_lease_key(job),
            ttl=task.options.lease_ttl,
            keep_alive=partial(self._keep_alive, delivery, job.id),
            keeper=self.keeper,
        )
        tel = self.tel
        jt = tel.job(job, delivery.received)
        if tel.metering:
            tel.observe("aqw.job.wait", max(0.0, time.time() - job.enqueued_at), job.task)
            lease.on_renewed(lambda _: tel.count("aqw.lease.renewals", job.task))
            lease.on_lost(lambda _: tel.count("aqw.lease.lost", job.task))
        run = RunningJob(job, lease, jt)
        error: BaseException | None = None
        lease_started = now_ns() if tel.tracing else 0
        try:
            try:
                if not await self._take_lease(lease, delivery, waited):
                    # Another holder is running this job, or it is no longer ours.
                    self.stats.lease_busy += 1
                    jt.lease_refused(lease_started)
                    return
                async with lease:
                    jt.lease_acquired(lease, lease_started)
                    self._running[job.id] = run
                    if job.key is not None and await self.broker.is_completed(job):
                        outcome = Outcome("skip")
                    else:
                        began = time.perf_counter()
                        with jt.handler() as span:
                            outcome = await run_handler(task, payload, Context(job, lease, self))
                            if outcome.kind == "ok" and task.options.invalidates is not None:
                                outcome = await self._invalidate(task, payload)
                            if outcome.error is not None and span is not None:
                                tel.record_error(span, outcome.error)
                                span.set_status(Status(StatusCode.ERROR, describe(outcome.error)))
                        elapsed = time.perf_counter() - began
                        self.window.duration(elapsed)
                        tel.observe("aqw.job.duration", elapsed, job.task)
                    lease.hand_over()
            except LeaseLost as exc:
                self.stats.lease_lost += 1
                error = exc
                log.warning("job %s (%s): %s; not acknowledged", job.id, job.task, exc)
                return
            except asyncio.CancelledError:
                jt.settled("requeue")
                await self._give_back(delivery)
                raise
            error = outcome.error
            current = asyncio.current_task()
            if current is not None:
                self._settling.add(current)  # finished: a shutdown must not cancel its settle
            await self._settle(task, delivery, job, lease, outcome, jt)
        except Exception as exc:
            error = exc
            await self._crashed(delivery, exc, lease if lease.token else None)
        finally:
            self._finish_run(run)
            jt.end(error)

    async def _take_lease(self, lease: Lease, delivery: Delivery, waited: float) -> bool:
        """Acquire the job's lease; False when another holder has the job. A lost connection
        is retried with backoff (no attempt is spent) until the lease's TTL, then the
        delivery is handed back for immediate redelivery."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + lease.ttl
        backoff = Backoff(0.05, 1.0)
        while True:
            try:
                await lease.acquire()
                break
            except LeaseUnavailable:
                return False
            except TRANSIENT as exc:
                # The SET may have reached the server before the connection broke: drop the
                # key if it is ours, or the next try would find it held by ourselves.
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(0.5):
                        await lease.backend.release(lease.key, lease.token)
                if loop.time() >= give_up or self._stop.is_set():
                    log.warning("job lease %r: %r; handing the job back", lease.key, exc)
                    await self._give_back(delivery)
                    return False
                await asyncio.sleep(backoff.next())
        if waited > self._min_ttl / 2 and not await self.broker.keep_alive(delivery):
            # It waited in the buffer long enough for another worker to take it over, and
            # perhaps finish it: running it again would run it twice.
            await lease.release()
            return False
        return True

    async def _crashed(self, delivery: Delivery, exc: Exception, lease: Lease | None) -> None:
        """The job path itself failed (a bug, damaged data, a backend error that is not a
        lost connection): retry the job with backoff while it has retries left, else
        dead-letter it with the reason. A delivery is never left pending to fail again."""
        log.error("job path failed for message %s: %s", delivery.id, describe(exc), exc_info=exc)
        job = delivery.job
        task = self.app.tasks.get(job.task) if job is not None else None
        try:
            if (
                job is not None
                and task is not None
                and task.options.retry.retries_left(job.attempt)
            ):
                delay = task.options.retry.delay(job.attempt)
                retry = partial(
                    self.broker.retry, delivery, next_attempt(job), time.time() + delay, lease
                )
                if await self._settle_step(retry):
                    self.stats.retried += 1
                    self.window.count("retried")
                return
            await self._dead_letter(delivery, exc, lease)
        except Exception as again:
            log.error("could not settle message %s (%s); it is redelivered after its lease",
                      delivery.id, describe(again))  # fmt: skip

    def _finish_run(self, run: RunningJob) -> None:
        if self._running.get(run.job.id) is run:
            del self._running[run.job.id]
        if run.published:
            self._spawn(self.broker.clear_job_state(run.job.id))

    def _publish_due_states(self) -> None:
        """Publish the state of jobs that have now run ``STATE_AFTER`` seconds (checked by
        the heartbeat loop, so short jobs cost no timer and no round trip)."""
        horizon = time.time() - STATE_AFTER
        for run in list(self._running.values()):
            if not run.published and run.started <= horizon:
                run.published = True
                self._spawn(self._publish_state(run))

    async def _publish_state(self, run: RunningJob) -> None:
        run.published = True
        await self.broker.set_job_state(run.job.id, run.state(self.name), run.lease.ttl)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        async def quietly() -> None:
            try:
                await coro
            except Exception as exc:
                log.debug("background step failed: %r", exc)

        task = asyncio.get_running_loop().create_task(quietly())
        self._background.add(task)  # the loop holds tasks weakly
        task.add_done_callback(self._background.discard)

    async def _keep_alive(self, delivery: Delivery, job_id: str) -> bool:
        alive = await self.broker.keep_alive(delivery)
        run = self._running.get(job_id)
        if alive and run is not None and run.published:
            self._spawn(self._publish_state(run))
        return alive

    async def report_progress(self, ctx: Context, fraction: float, message: str) -> None:
        """Record a running job's progress and publish its state at once."""
        run = self._running.get(ctx.job.id)
        if run is None:
            return
        run.progress, run.message = fraction, message
        await self._publish_state(run)

    def _decode(self, delivery: Delivery) -> Job | None:
        try:
            cap = self._receipt_cap
            if cap is not None and len(delivery.data) > cap + RECEIPT_SLACK:
                raise PayloadTooLarge("(any)", len(delivery.data), cap, where=" (as received)")
            delivery.job = Job.decode(delivery.data)
        except (MalformedJob, PayloadTooLarge) as exc:
            self.stats.malformed += 1
            log.error("message %s is malformed: %s", delivery.id, exc)
            self._spawn(self._dead_letter(delivery, exc))
            return None
        return delivery.job

    async def _settle(
        self,
        task: Task[Any],
        delivery: Delivery,
        job: Job,
        lease: Lease,
        outcome: Outcome,
        jt: JobTrace,
    ) -> None:
        if outcome.kind in ("ok", "skip"):
            if await self._settle_step(partial(self.broker.ack, delivery, lease)):
                jt.settled("ack" if outcome.kind == "ok" else "skip")
                if outcome.kind == "skip":
                    self.stats.duplicates_skipped += 1
                    self.window.count("skipped")
                    self.tel.count("aqw.jobs.duplicates_skipped", task.name)
                    log.info("job %s (%s) already completed under key %r; skipped",
                             job.id, job.task, job.key)  # fmt: skip
                else:
                    self.stats.processed += 1
                    self.window.count("processed")
                    self.tel.count("aqw.jobs.processed", task.name)
                    self.runaway.record(task.name, False)
            else:
                self._lost_at_settle(job)
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
            nxt = next_attempt(job)
            log.warning(
                "job %s (%s) attempt %d failed: %s; retrying in %.2fs",
                job.id, job.task, job.attempt, describe(error), delay,
            )  # fmt: skip
            retry = partial(self.broker.retry, delivery, nxt, time.time() + delay, lease)
            if await self._settle_step(retry):
                jt.settled("retry", {ATTR_RETRY_DELAY: delay})
                self.stats.retried += 1
                self.window.count("retried")
                self.tel.count("aqw.jobs.retried", task.name)
                self.runaway.record(task.name, True)
            else:
                self._lost_at_settle(job)
            return
        self.runaway.record(task.name, False)
        if await self._dead_letter(delivery, error, lease):
            jt.settled("dead_letter", {ATTR_DLQ_REASON: describe(error)})
        else:
            self._lost_at_settle(job)

    def _lost_at_settle(self, job: Job) -> None:
        self.stats.lease_lost += 1
        log.warning(
            "job %s (%s): its lease passed to another holder before settling", job.id, job.task
        )

    async def _dead_letter(
        self,
        delivery: Delivery,
        error: BaseException,
        lease: Lease | None = None,
        *,
        payload_error: bool = False,
    ) -> bool:
        job = delivery.job
        first = first_failure(job) if job else 0.0
        reason = describe(error, payload_error)
        failure = Failure(
            error_type=type(error).__name__,
            error=reason,
            traceback=self._traceback(error),
            worker=self.name,
            first_failed_at=first,
            failed_at=time.time(),
        )
        attempts = job.attempt if job else delivery.delivery_count
        log.error("dead-lettering message %s (%s): %s", delivery.id,
                  job.task if job else "undecodable", reason)  # fmt: skip
        ok = await self._settle_step(
            partial(self.broker.dead_letter, delivery, failure, attempts, lease)
        )
        if ok:
            self.stats.dead += 1
            self.window.count("dead")
            self.tel.count("aqw.jobs.dead_lettered", job.task if job else None)
        return ok

    def _traceback(self, error: BaseException) -> str:
        if self.app.redact_errors:
            return redact_traceback(error, limit=8000)
        return "".join(traceback.format_exception(error))[-8000:]

    async def _give_back(self, delivery: Delivery) -> None:
        """Cancelled mid-job (shutdown): hand the delivery back for immediate redelivery."""
        give = asyncio.ensure_future(self.broker.requeue(delivery, None))
        try:
            if await asyncio.shield(give):
                self.stats.requeued += 1
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            log.warning("could not hand back %s (%r); it is redelivered after its idle time",
                        delivery.id, exc)  # fmt: skip

    async def _invalidate(self, task: Task[Any], payload: Any) -> Outcome:
        """Invalidate the task's cache keys after its write and before its ack, so no stale
        entry is visible once the job is acknowledged; a failure reruns the job."""
        assert self.app.cache is not None
        try:
            keys = task.options.keys_to_invalidate(payload)
            if keys:
                await self.app.cache.invalidate(*keys)
        except Exception as exc:
            log.warning("task %s: invalidating its cache keys failed (%r)", task.name, exc)
            return Outcome("retry", exc)
        return Outcome("ok")

    async def _settle_step(self, step: Callable[[], Awaitable[bool]]) -> bool:
        return await with_retries(step, within=self._max_ttl)

    # -- handler helpers -------------------------------------------------------------------

    def resource_lock(self, name: str, *, ttl: float, wait: float | None) -> Lease:
        """A lease on a named resource of this queue, renewed by this worker's keeper;
        its acquisitions are traced and its contention counted."""
        key = QueueKeys(self.app.queue).lock(name)
        return ResourceLock(
            self.tel, name, self.broker.lease_backend(), key, ttl=ttl, wait=wait,
            keeper=self.keeper,
        )  # fmt: skip
