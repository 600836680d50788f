"""What a worker tells the outside: its heartbeat summary (read by ``aqw status`` and the
monitor) and the stuck-job watchdog (jobs running past twice their task's SLA)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Mapping
from typing import Any, Protocol

from .._version import __version__
from ..brokers.base import Broker
from ..lease import LeaseKeeper
from ..task import Task
from ..telemetry import EVENT_STUCK, Telemetry
from ._failures import ErrorTracker, RunawayGuard
from ._intake import Intake
from ._running import RunningJobs, WorkerStats, vars_of
from ._scheduler import Scheduler
from ._stats import SlidingStats


class HeartbeatApp(Protocol):
    @property
    def queue(self) -> str: ...
    @property
    def tasks(self) -> Mapping[str, Task[Any]]: ...


class Worker(Protocol):
    """What the heartbeat and the watchdog read of a worker."""

    @property
    def app(self) -> HeartbeatApp: ...
    @property
    def in_flight(self) -> int: ...

    name: str
    queues: tuple[str, ...]
    state: str
    started_at: float
    concurrency: int
    running: RunningJobs
    stuck_reported: set[str]
    stats: WorkerStats
    keeper: LeaseKeeper
    window: SlidingStats
    errors: ErrorTracker
    runaway: RunawayGuard
    tel: Telemetry
    scheduler: Scheduler
    intake: Intake


log = logging.getLogger("aqw.worker")


async def publish_beat(
    broker: Broker, worker: str, data: dict[str, Any], ttl: float, window: SlidingStats
) -> None:
    """Publish ``worker``'s summary for ``ttl`` seconds (``broker.status``), the queue's
    depth sample of this bucket unless it has one (``broker.history``), and the counts of
    the slots ``window`` has finished since the last beat (``broker.rates``)."""
    await broker.status.publish_heartbeat(worker, data, ttl)
    if broker.history is not None:
        await broker.history.sample(time.time())
    await add_rates(broker, window)


async def add_rates(broker: Broker, window: SlidingStats, final: bool = False) -> None:
    """Add ``window``'s unflushed slots to the queue's rates (one write; nothing when the
    broker keeps none or nothing finished since the last time)."""
    if broker.rates is None:
        return
    tallies, mark = window.unflushed(final)
    if tallies:
        await broker.rates.add(tallies)
    window.flushed_to(mark)


async def withdraw(broker: Broker, worker: str, window: SlidingStats) -> None:
    """As a worker stops: add its last counts to the rates and withdraw its heartbeat
    (best effort: the broker may be down)."""
    with contextlib.suppress(Exception):
        await add_rates(broker, window, final=True)
    with contextlib.suppress(Exception):
        await broker.status.remove_heartbeat(worker)


def stuck_jobs(worker: Worker) -> list[dict[str, Any]]:
    """Jobs of ``worker`` running longer than twice their task's ``sla``."""
    now = time.time()
    out = []
    for run in worker.running:
        task = worker.app.tasks.get(run.job.task)
        sla = task.options.sla if task is not None else None
        if sla is not None and now - run.started > 2 * sla:
            out.append(
                {
                    "job_id": run.job.id,
                    "task": run.job.task,
                    "sla": sla,
                    "started_at": run.started,
                    "running_for": now - run.started,
                    "worker": worker.name,
                }
            )
    return out


def report_stuck(worker: Worker) -> None:
    """Log, count and trace each newly stuck job once."""
    for stuck in stuck_jobs(worker):
        if stuck["job_id"] in worker.stuck_reported:
            continue
        worker.stuck_reported.add(stuck["job_id"])
        worker.stats.stuck += 1
        worker.tel.count("aqw.jobs.stuck", stuck["task"])
        run = worker.running.get(stuck["job_id"])
        if run is not None:
            run.trace.event(EVENT_STUCK, {"aqw.sla": stuck["sla"]})
        log.warning(
            "job %s (%s) is stuck: running %.1fs, more than 2x its SLA of %.1fs",
            stuck["job_id"],
            stuck["task"],
            stuck["running_for"],
            stuck["sla"],
        )
    worker.stuck_reported &= worker.running.ids()


def summary(worker: Worker) -> dict[str, Any]:
    """What this worker publishes in its heartbeat: state, counters, recent rates,
    duration quantiles, running and stuck jobs, and the most frequent errors."""
    return {
        "worker": worker.name,
        "queue": worker.queues[0],
        "queues": list(worker.queues),
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "version": __version__,
        "state": worker.state,
        "paused": worker.intake.paused,
        "at": time.time(),
        "started_at": worker.started_at,
        "concurrency": worker.concurrency,
        "in_flight": worker.in_flight,
        "leases": len(worker.keeper),
        "totals": worker.stats.as_dict(),
        "last_1m": worker.window.totals(60),
        "last_5m": worker.window.totals(300),
        "duration_5m": worker.window.quantiles((0.5, 0.99)),
        "running": [
            {
                "job_id": r.job.id,
                "task": r.job.task,
                "attempt": r.job.attempt,
                "started_at": r.started,
                "progress": r.progress,
            }
            for r in list(worker.running)[:100]
        ],
        "stuck": stuck_jobs(worker),
        "errors": [vars_of(e) for e in worker.errors.top(10)],
        "runaway": sorted(t for t in worker.app.tasks if worker.runaway.running_away(t)),
        # this worker's scheduler holds the leader lease of the periodic tasks (the dashboard)
        "scheduler_leader": worker.scheduler.leader,
    }
