"""Running an app's jobs in a test, on the in-process broker: ``use_memory`` points an app
at fresh ``memory://`` queues, ``run_until_idle`` runs a worker until nothing is queued or
running and returns what each job ended as, and ``eager`` runs each enqueued job inline,
before its ``enqueue`` returns. All three run the real path: the enqueue's checks, leases,
retries, the dead-letter queue and job records, as a worker in production does."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..app import App
from ..brokers import Broker, QueueDepth
from ..brokers.local import LocalJobRecords
from ..brokers.memory import delete_memory_queue
from ..record import FINAL_STATES, JobInfo
from ..worker import WorkerStats

__all__ = ["Outcomes", "eager", "queues_of", "run_until_idle", "use_memory"]

#: Seconds ``run_until_idle`` waits, by default, for the queues to go idle.
IDLE_TIMEOUT = 60.0


def queues_of(app: App) -> list[str]:
    """The app's queue, then every other queue one of its tasks sends to, in name order."""
    others = {t.options.queue for t in app.tasks.values() if t.options.queue}
    return [app.queue, *sorted(others - {app.queue})]


@contextlib.contextmanager
def use_memory(app: App) -> Iterator[App]:
    """Point ``app`` at fresh in-process queues (its own queue's name, and its tasks'
    queues, on ``memory://``, emptied before and after), and back at its broker on exit.
    Whatever the app's broker was (a ``redis://`` URL included), nothing leaves the
    process."""
    broker, url, queue = app.broker, app.broker_url, app.queue
    names = queues_of(app)
    for name in names:
        delete_memory_queue(name)
    app.use_broker(f"memory://{queue}", queue)
    try:
        yield app
    finally:
        for name in queues_of(app):
            delete_memory_queue(name)
        app.use_broker(broker, queue)
        app.broker_url = url


@dataclass
class Outcomes:
    """What a run ended: each job's record (``aqw.JobInfo``) in the order they ended
    (``jobs``), and the worker's counters (``stats``)."""

    jobs: list[JobInfo] = field(default_factory=list)
    stats: WorkerStats = field(default_factory=WorkerStats)

    @property
    def states(self) -> Counter[str]:
        """How many jobs ended in each state (``succeeded``, ``dead``, ``cancelled``, ...)."""
        return Counter(info.state for info in self.jobs)

    def of(self, job_id: str) -> JobInfo:
        """The record of job ``job_id`` as this run ended it (KeyError: it did not end)."""
        for info in self.jobs:
            if info.id == job_id:
                return info
        raise KeyError(f"job {job_id!r} did not end in this run")

    def by_task(self, task: str) -> list[JobInfo]:
        """The jobs of task ``task`` this run ended."""
        return [info for info in self.jobs if info.task == task]

    def __len__(self) -> int:
        return len(self.jobs)


def _records(app: App, queues: list[str]) -> list[LocalJobRecords]:
    out = []
    for name in queues:
        broker: Broker = app.broker_for(name)
        records = broker.records
        if not broker.in_process or not isinstance(records, LocalJobRecords):
            raise TypeError(
                f"run_until_idle: queue {name!r} is on {broker.describe()}, not memory://: "
                "point the app at the in-process broker first (aqw.testing.use_memory(app), "
                "or the aqw_app fixture)"
            )
        out.append(records)
    return out


def _ended(before: list[dict[str, str]], records: list[LocalJobRecords]) -> list[JobInfo]:
    """The records that read a final state now and did not before, by end time."""
    out: list[JobInfo] = []
    for seen, part in zip(before, records, strict=True):
        for job_id, state in part.states().items():
            if state in FINAL_STATES and seen.get(job_id) not in FINAL_STATES:
                info = part.info(job_id)
                if info is not None:
                    out.append(info)
    out.sort(key=lambda info: info.finished_at or 0.0)
    return out


async def run_until_idle(
    app: App, *, timeout: float = IDLE_TIMEOUT, concurrency: int = 10
) -> Outcomes:
    """Run a worker on the app's queues (``queues_of``) until nothing is queued or running
    there (a retry or delayed job due within a few seconds is waited for, a later one is
    left delayed), and return what it ended (``Outcomes``).

    The app must be on ``memory://`` (``use_memory``, or the ``aqw_app`` fixture).
    TimeoutError after ``timeout`` seconds if it is still busy (a job that enqueues
    another for ever, a retry loop): the worker is stopped first, its running jobs handed
    back."""
    queues = queues_of(app)
    records = _records(app, queues)
    before = [part.states() for part in records]
    worker = app.worker(concurrency=concurrency, burst=True, queues=queues, heartbeat=3600.0)
    token = _running.set(True)
    try:
        async with worker:
            try:
                async with asyncio.timeout(timeout):
                    await worker.wait_stopped()
            except TimeoutError:
                depth = QueueDepth.total([await app.broker_for(q).depth() for q in queues])
                raise TimeoutError(
                    f"run_until_idle: the queues {', '.join(queues)} are not idle after "
                    f"{timeout}s ({depth.waiting} waiting, {depth.in_flight} running, "
                    f"{depth.delayed} delayed)"
                ) from None
    finally:
        _running.reset(token)
    return Outcomes(_ended(before, records), worker.stats)


#: True inside ``run_until_idle``: an eager enqueue from a running job does not start
#: another worker (the running one takes its job).
_running: contextvars.ContextVar[bool] = contextvars.ContextVar("aqw_testing_run", default=False)


@contextlib.contextmanager
def eager(app: App, *, timeout: float = IDLE_TIMEOUT) -> Iterator[App]:
    """Run every job enqueued on ``app`` inline: ``await task.enqueue(...)`` validates and
    enqueues the job as usual, then runs the app's queues until idle (``run_until_idle``)
    before it returns, so its record and result are there already
    (``await app.result(job_id)`` returns at once). A job a running job enqueues runs in the
    same run, after it. A job delayed past a few seconds stays delayed.

    The app must be on ``memory://`` (``use_memory``, or the ``aqw_app`` fixture)."""
    _records(app, queues_of(app))  # refused here, in one line, rather than at an enqueue
    plain = app.enqueue

    async def enqueue(*args: Any, **kwargs: Any) -> Any:
        ids = await plain(*args, **kwargs)
        if not _running.get():
            await run_until_idle(app, timeout=timeout)
        return ids

    app.enqueue = enqueue  # type: ignore[method-assign]
    try:
        yield app
    finally:
        del app.enqueue
