"""The blocked-loop watchdog: a handler that blocks the event loop (``time.sleep``, sync I/O,
CPU-bound work) stops every lease renewal of the worker while it does, and its jobs lose
their leases with no hint of why. This loop sleeps a short ``interval`` and measures how late
it woke; a wake later than ``threshold`` means the loop was blocked (or the process paused)
that long: it logs a WARNING naming the jobs running then, counts
``aqw.worker.loop_blocked`` and ``WorkerStats.loop_blocked``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

from ..context import job_fields
from ..task import Task
from ..telemetry import Telemetry
from ._running import RunningJobs, WorkerStats

log = logging.getLogger("aqw.worker")

#: The longest sleep between two checks (seconds).
MAX_INTERVAL = 0.25

#: Jobs a warning names before "and N more".
NAMED_JOBS = 5


class WatchedApp(Protocol):
    """What the watchdog needs of the worker's App: its lease TTLs."""

    @property
    def lease_ttl(self) -> float: ...
    @property
    def tasks(self) -> Mapping[str, Task[Any]]: ...


class Watched(Protocol):
    """What the watchdog needs of the worker it watches."""

    @property
    def app(self) -> WatchedApp: ...
    @property
    def running(self) -> RunningJobs: ...
    @property
    def stats(self) -> WorkerStats: ...
    @property
    def tel(self) -> Telemetry: ...


def shortest_ttl(app: WatchedApp) -> float:
    """The shortest lease TTL any job of ``app`` runs under."""
    return min([app.lease_ttl, *(t.options.lease_ttl for t in app.tasks.values())])


class LoopWatchdog:
    """Watches one worker's event loop for stalls.

    Args:
        running: the worker's running jobs (named in the warning).
        stats: the worker's counters (``loop_blocked`` is incremented).
        tel: the queue's telemetry (``aqw.worker.loop_blocked`` is counted).
        min_ttl: the shortest lease TTL of the worker's jobs.
        interval: seconds between checks; default a quarter of ``min_ttl``, at most 0.25 s.
        threshold: a wake this much later than due is a blocked loop; default a third of
            ``min_ttl`` (the lease renewal period: a stall that long delays a renewal).
    """

    def __init__(
        self,
        running: RunningJobs,
        stats: WorkerStats,
        tel: Telemetry,
        *,
        min_ttl: float,
        interval: float | None = None,
        threshold: float | None = None,
    ) -> None:
        self.running = running
        self.stats = stats
        self.tel = tel
        self.min_ttl = min_ttl
        self.interval = min(MAX_INTERVAL, min_ttl / 4) if interval is None else interval
        self.threshold = min_ttl / 3 if threshold is None else threshold

    @classmethod
    def of(cls, worker: Watched) -> LoopWatchdog:
        """The watchdog of ``worker``, with the default interval and threshold."""
        return cls(worker.running, worker.stats, worker.tel, min_ttl=shortest_ttl(worker.app))

    async def run(self) -> None:
        """Check until cancelled (the worker cancels its loops when it stops)."""
        while True:
            slept = time.monotonic()
            await asyncio.sleep(self.interval)
            late = time.monotonic() - slept - self.interval
            if late > self.threshold:
                self.blocked(late, since=slept)

    def blocked(self, seconds: float, since: float | None = None) -> None:
        """Report a stall of ``seconds``, naming the jobs running now and those that ended
        after ``since`` (monotonic): a handler that blocks may end before this wakes."""
        ended = self.running.ended_since(since) if since is not None else []
        runs = {run.job.id: run for run in [*ended, *self.running]}
        self.stats.loop_blocked += 1
        self.tel.count("aqw.worker.loop_blocked")
        named = [
            f"{run.job.task} (job {run.job.id} attempt {run.job.attempt})"
            for run in list(runs.values())[:NAMED_JOBS]
        ]
        if len(runs) > NAMED_JOBS:
            named.append(f"and {len(runs) - NAMED_JOBS} more")
        extra: dict[str, Any] = {"blocked_s": round(seconds, 3)}
        if len(runs) == 1:
            extra.update(job_fields(next(iter(runs.values())).job))
        log.warning(
            "event loop blocked for %.2fs or more (threshold %.2fs, shortest lease_ttl %gs) "
            "while running %s: lease renewals wait for the loop, and a job blocked past its "
            "lease_ttl loses its lease (another worker may run it again). Blocking calls in an "
            "async handler (time.sleep, sync I/O, CPU work) belong in asyncio.to_thread or a "
            "process pool",
            seconds,
            self.threshold,
            self.min_ttl,
            ", ".join(named) if named else "no job",
            extra=extra,
        )
