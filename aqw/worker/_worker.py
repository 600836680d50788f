"""The worker: its lifecycle (start, graceful and forced stop), its heartbeat, and the wiring
of its parts: ``Intake`` (``_intake.py``: fetch, promote, reclaim) feeds ``Slots``
(``_slots.py``), each delivery runs as ``JobPath.process`` (``_job_path.py``: decode, find
the task, validate, take the lease, run the handler in ``_handler.py``) and ends in a
``Settler`` step (``_settle.py``); the outbox's relay runs beside them. The worker sees its
App through ``WorkerApp``, a Protocol."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from .._ids import consumer_name
from .._text import plural
from ..brokers.base import DEFAULT_PRIORITY_SHARE, QueueDepth
from ..context import Context
from ..errors import BrokerUnavailable, ConfigError
from ..job import Job
from ..lease import Lease, LeaseKeeper
from ..outbox import Relay
from ._app import WorkerApp
from ._failures import ErrorTracker, RunawayGuard
from ._heartbeat import publish_beat, report_stuck, stuck_jobs, summary, withdraw
from ._intake import Intake
from ._job_path import JobPath
from ._locks import ResourceLock
from ._log_lines import Hints, log_started, log_stopped
from ._needs import check_shared_parts
from ._options import (
    check_options,
    consumed_broker,
    depth_readings,
    depths_of,
    desired_of,
    rate_readings,
    route,
)
from ._outage import Outage
from ._running import RunningJobs, WorkerStats
from ._scheduler import Scheduler
from ._settle import Settler
from ._slots import Slots
from ._stats import SlidingStats
from ._stopping import Stopping
from ._watchdog import LoopWatchdog

log = logging.getLogger("aqw.worker")

#: Seconds between the heartbeat loop's checks for stuck jobs.
STUCK_CHECK = 0.25


class Worker:
    """Runs an app's jobs in the current event loop. Use ``async with app.worker(...)`` to
    embed it (it runs in the background until the block exits), or ``run`` to run it
    until stopped (signal, ``request_stop``, or an empty queue in burst mode)."""

    def __init__(
        self,
        app: WorkerApp,
        *,
        concurrency: int = 100,
        prefetch: int = 0,
        grace: float = 30.0,
        burst: bool = False,
        handle_signals: bool = False,
        name: str | None = None,
        heartbeat: float = 5.0,
        queues: Sequence[str] | Mapping[str, float] | None = None,
        priority_share: float = DEFAULT_PRIORITY_SHARE,
    ) -> None:
        check_options(concurrency, prefetch, grace, heartbeat, priority_share)
        self.app = app
        self.queues, self.broker = consumed_broker(app, queues)
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.grace = grace
        self.burst = burst
        self.handle_signals = handle_signals
        self.name = name or consumer_name()
        self.heartbeat = heartbeat
        self.state = "idle"  # idle -> running -> stopping -> stopped
        self.started_at = 0.0
        self.stats = WorkerStats()
        errors, runaway = ErrorTracker(redact=app.redact_errors), RunawayGuard()
        self.keeper = LeaseKeeper()
        self.window = SlidingStats()
        self.stuck_reported: set[str] = set()
        self.tel = app.telemetry
        self._transient = self.broker.transient_errors
        self._depths: dict[str, QueueDepth] = {}
        self._desired: dict[str, int] = {}  # the autoscaling signal per queue (gauge)
        self._background: set[asyncio.Task[Any]] = set()
        self._stop = asyncio.Event()
        self.stopping = Stopping(self._stop)  # a second signal: stop without waiting for jobs
        self._loops: list[asyncio.Task[None]] = []
        ttls = [app.lease_ttl, *(t.options.lease_ttl for t in app.tasks.values())]
        self._max_ttl = max(ttls)
        self.running = RunningJobs(self.broker, self.name, self._spawn)
        #: How the copy-paste commands of its log lines name the app (``Hints.target``).
        self.hints = Hints(app)
        self.paths: dict[str, JobPath] = {}  # a job path per queue, on its broker and telemetry
        self.slots = Slots(concurrency, route(self.paths, self.queues))
        for queue in self.queues:
            broker, tel = app.broker_for(queue), app.telemetry_for(queue)
            settler = Settler(
                broker,
                worker=self.name,
                stats=self.stats,
                window=self.window,
                errors=errors,
                runaway=runaway,
                tel=tel,
                record_ttl=app.idempotency_ttl,
                redact=app.redact_errors,
                within=self._max_ttl,
                hints=self.hints,
            )
            self.paths[queue] = JobPath(
                broker=broker,
                tasks=app.tasks,
                payload_limit=app.payload_limit,
                cache=app.cache,
                host=self,
                tel=tel,
                keeper=self.keeper,
                settler=settler,
                running=self.running,
                settle_started=self.slots.settle_started,
                stats=self.stats,
                window=self.window,
                stopping=self._stop,
                spawn=self._spawn,
            )
        self.path = self.paths[self.queues[0]]
        self.settler = self.path.settler
        #: One voice for a broker outage, shared by the fetch, promote, reclaim and heartbeat
        #: loops: a warning when the broker stops answering, a line when it answers again.
        self.outage = Outage(self.broker.describe())
        self.scheduler = Scheduler(self.broker, app.tasks, self._stop, self.outage, self.name)
        self.relay = None if app.outbox is None else Relay(app.outbox, app, self._stop, self.name)
        self.intake = Intake(
            self.broker,
            self.slots,
            self._stop,
            self.tel,
            prefetch=prefetch,
            burst=burst,
            lease_ttl=self.app.lease_ttl_of,
            min_ttl=min(ttls),
            outage=self.outage,
            retry_due=lambda: max(p.settler.retry_due for p in self.paths.values()),
            share=priority_share,  # its lower priority levels' share of fetches
        )

    @property
    def errors(self) -> ErrorTracker:
        """Error fingerprints of failed jobs, with recent counts (in the heartbeat)."""
        return self.settler.errors

    @errors.setter
    def errors(self, tracker: ErrorTracker) -> None:
        for path in self.paths.values():
            path.settler.errors = tracker

    @property
    def runaway(self) -> RunawayGuard:
        """The guard that slows the retries of a task whose jobs mostly fail."""
        return self.settler.runaway

    @runaway.setter
    def runaway(self, guard: RunawayGuard) -> None:
        for path in self.paths.values():
            path.settler.runaway = guard

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Jobs running now."""
        return self.slots.in_flight

    def running_jobs(self) -> list[tuple[Job, float]]:
        """(job, started at) of every job running now."""
        return [(run.job, run.started) for run in self.running]

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
        self.scheduler.check()  # periodic tasks need keyed enqueues and shared marks
        check_shared_parts(self.broker, self.app.tasks)
        try:
            await self.broker.connect()
        except self._transient as exc:
            raise BrokerUnavailable(
                f"cannot reach the {self.broker.system} broker of queue {self.app.queue!r}: {exc}"
            ) from exc
        self.broker.expect_lease_ttl(self._max_ttl)
        await self.broker.start_consuming(self.name)
        self.state = "running"
        self.started_at = time.time()
        spawn = asyncio.get_running_loop().create_task
        self._loops = [
            spawn(self.intake.fetch_loop(), name="aqw-fetch"),
            spawn(self.intake.promote_loop(), name="aqw-promote"),
            spawn(self.intake.reclaim_loop(), name="aqw-reclaim"),
            spawn(self.intake.pause_loop(), name="aqw-pause"),
            spawn(self._heartbeat_loop(), name="aqw-heartbeat"),
            spawn(LoopWatchdog.of(self).run(), name="aqw-watchdog"),
            spawn(self.scheduler.run(), name="aqw-scheduler"),
            spawn(self.broker.watch_cancels(self.running.cancel), name="aqw-cancels"),
        ]
        if self.relay is not None:  # every worker runs one; the leader relays
            self._loops.append(spawn(self.relay.run(), name="aqw-outbox"))
        if self.handle_signals:
            self._install_signal_handlers()
        self.tel.add_gauges(self._gauges)
        cache = self.app.cache
        if cache is not None and cache.on_event is None and self.tel.metering:
            cache.on_event = self.tel.cache_hook()
        log_started(self.name, self.broker, self.queues, self.concurrency, self.app.tasks)

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
        await self.slots.give_back_buffer(self.broker)
        try:  # a read cancelled above may already have taken entries for this consumer
            given = await self.broker.give_back_unstarted(set(self.slots.jobs.values()))
            if given:
                log.info("handed back %s fetched as the worker stopped", plural(given, "job"))
        except self._transient as exc:
            log.warning("could not hand back fetched jobs (%r); they are reclaimed later", exc)
        await self._drain(grace)
        if self._background:  # e.g. dead-lettering a malformed message
            await asyncio.wait(set(self._background), timeout=5.0)
        await self.keeper.close()
        self.tel.remove_gauges(self._gauges)
        self.tel.flush()  # the histogram values kept since the last collection
        await withdraw(self.broker, self.name, self.window)
        if self.handle_signals:
            self._remove_signal_handlers()
        self.state = "stopped"
        log_stopped(self.name, time.time() - self.started_at, self.stats)

    async def _drain(self, grace: float) -> None:
        await self.stopping.drain(self.slots, grace, self._max_ttl)

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
        self.stopping.on_signal(sig)

    # -- background loops ------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        """Publish this worker's summary every ``heartbeat`` seconds; several times a second,
        publish the state of jobs that have run a while and watch for stuck jobs (running
        longer than twice their task's ``sla``)."""
        last_beat = 0.0
        while not self._stop.is_set():
            self.running.publish_due()
            report_stuck(self)
            now = time.monotonic()
            if now - last_beat >= self.heartbeat:
                last_beat = now
                try:
                    beat = self.summary()
                    await publish_beat(
                        self.broker, self.name, beat, self.heartbeat * 3, self.window
                    )
                    if self.tel.metering:
                        self._depths = await depths_of(self.paths)
                        self._desired = await desired_of(self.paths, self._depths)
                except self._transient as exc:
                    self.outage.failed("publishing the worker heartbeat", exc)
                else:
                    self.outage.ok()
            await asyncio.sleep(min(self.heartbeat, STUCK_CHECK))

    def _gauges(self) -> list[tuple[str, float, dict[str, Any]]]:
        readings = [
            (
                "aqw.worker.in_flight",
                float(self.in_flight),
                {**self.tel.metric_attributes(None), "aqw.worker": self.name},
            )
        ]
        return (
            readings
            + depth_readings(self.paths, self._depths, self._desired)
            + rate_readings(self.paths)
        )

    def summary(self) -> dict[str, Any]:
        """What this worker publishes in its heartbeat: state, counters, recent rates,
        duration quantiles, running and stuck jobs, and the most frequent errors."""
        return summary(self)

    def stuck_jobs(self) -> list[dict[str, Any]]:
        """Jobs running longer than twice their task's ``sla``."""
        return stuck_jobs(self)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        """Run a best-effort step in the background (publishing a job's state, dead-lettering
        a malformed message); the worker waits for these when it stops."""

        async def quietly() -> None:
            try:
                await coro
            except Exception as exc:
                log.debug("background step failed: %r", exc)

        task = asyncio.get_running_loop().create_task(quietly())
        self._background.add(task)  # the loop holds tasks weakly
        task.add_done_callback(self._background.discard)

    # -- what a handler's ctx asks of the worker --------------------------------------------

    async def report_progress(
        self, ctx: Context, fraction: float, message: str, detail: str | None = None
    ) -> None:
        """Record a running job's progress and publish its state (and stream it) at once."""
        await self.running.report_progress(ctx.job.id, fraction, message, detail)

    def settle_transaction(self, ctx: Context) -> AbstractAsyncContextManager[Any]:
        """``ctx.transaction()``: the broker's transaction that also acks ``ctx``'s job."""
        if ctx.delivery is None or ctx.lease is None:
            raise ConfigError("ctx.transaction(): this job runs with no delivery to settle")
        keep_for = self.app.tasks[ctx.job.task].options.keep_for
        ttl = self.settler.record_ttl
        return self.broker.settle_in_transaction(ctx.delivery, ctx.job, ctx.lease, ttl, keep_for)

    def resource_lock(self, name: str, *, ttl: float, wait: float | None) -> Lease:
        """A lease on a named resource of this queue, renewed by this worker's keeper;
        its acquisitions are traced and its contention counted."""
        key = self.broker.lock_key(name)
        backend = self.broker.lease_backend()
        return ResourceLock(self.tel, name, backend, key, ttl=ttl, wait=wait, keeper=self.keeper)
