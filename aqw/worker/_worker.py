"""The worker: its lifecycle, its background loops (fetch with backpressure, promote due
jobs, reclaim abandoned ones, heartbeat) and its job slots.

Each fetched delivery runs in a slot as ``JobPath.process`` (``_job_path.py``): decode, find
the task, validate, take the lease, run the handler (``_handler.py``), settle
(``_settle.py``). The worker sees its App through ``WorkerApp``, a Protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections import deque
from collections.abc import Awaitable, Mapping
from typing import Any, Protocol

from .._ids import consumer_name
from ..brokers.base import Broker, Delivery, QueueDepth
from ..cache import Cache
from ..context import Context
from ..errors import BrokerUnavailable, ConfigError
from ..job import Job
from ..lease import Lease, LeaseKeeper
from ..task import Task
from ..telemetry import Telemetry, now_ns
from ._backoff import Backoff
from ._failures import ErrorTracker, RunawayGuard
from ._heartbeat import report_stuck, stuck_jobs, summary
from ._job_path import JobPath
from ._locks import ResourceLock
from ._running import STATE_AFTER, RunningJobs, WorkerStats
from ._settle import Settler
from ._stats import SlidingStats

log = logging.getLogger("aqw.worker")

#: In burst mode, delayed jobs due within this many seconds are waited for.
BURST_HORIZON = 10.0


class WorkerApp(Protocol):
    """What a worker needs of its App."""

    @property
    def broker(self) -> Broker: ...
    @property
    def queue(self) -> str: ...
    @property
    def tasks(self) -> Mapping[str, Task[Any]]: ...
    @property
    def lease_ttl(self) -> float: ...
    @property
    def idempotency_ttl(self) -> float: ...
    @property
    def redact_errors(self) -> bool: ...
    @property
    def cache(self) -> Cache | None: ...
    @property
    def telemetry(self) -> Telemetry: ...
    def payload_limit(self, task_name: str | None) -> int | None: ...


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
        self.stuck_reported: set[str] = set()
        self.tel = app.telemetry
        self._depth: QueueDepth | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self.state = "idle"  # idle -> running -> stopping -> stopped
        self.started_at = 0.0
        self._in_flight = 0
        self._jobs: dict[asyncio.Task[None], str] = {}  # job task -> its delivery id
        self._settling: set[asyncio.Task[Any]] = set()
        self.running = RunningJobs(self.broker, self.name, self._spawn)
        self._transient = self.broker.transient_errors
        self._buffer: deque[tuple[Delivery, float]] = deque()  # (delivery, buffered at)
        self._slot_free = asyncio.Event()
        self._stop = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        self._next_due: float | None = None
        self._idle_fetches = 0
        ttls = [app.lease_ttl, *(t.options.lease_ttl for t in app.tasks.values())]
        self._max_ttl = max(ttls)
        self._min_ttl = min(ttls)
        self.settler = Settler(
            self.broker, worker=self.name, stats=self.stats, window=self.window,
            errors=self.errors, runaway=self.runaway, tel=self.tel,
            record_ttl=app.idempotency_ttl, redact=app.redact_errors, within=self._max_ttl,
        )  # fmt: skip
        self.path = JobPath(
            broker=self.broker, tasks=app.tasks, payload_limit=app.payload_limit,
            cache=app.cache, host=self, tel=self.tel, keeper=self.keeper,
            settler=self.settler, running=self.running, settling=self._settling,
            stats=self.stats, window=self.window, stopping=self._stop,
            min_ttl=self._min_ttl, spawn=self._spawn,
        )  # fmt: skip

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Jobs running now."""
        return self._in_flight

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
        except self._transient as exc:
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
            except self._transient as exc:
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
        except self._transient:
            return
        if depth.waiting or depth.in_flight:
            return
        if depth.delayed:
            try:
                wait = await self.broker.promote_due()
            except self._transient:
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
            except self._transient as exc:
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
            except self._transient as exc:
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
            self.running.publish_due()
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
                except self._transient as exc:
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
        task = asyncio.get_running_loop().create_task(self.path.process(delivery, waited))
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

    async def report_progress(self, ctx: Context, fraction: float, message: str) -> None:
        """Record a running job's progress and publish its state at once."""
        await self.running.report_progress(ctx.job.id, fraction, message)

    def resource_lock(self, name: str, *, ttl: float, wait: float | None) -> Lease:
        """A lease on a named resource of this queue, renewed by this worker's keeper;
        its acquisitions are traced and its contention counted."""
        key = self.broker.lock_key(name)
        return ResourceLock(
            self.tel, name, self.broker.lease_backend(), key, ttl=ttl, wait=wait,
            keeper=self.keeper,
        )  # fmt: skip
