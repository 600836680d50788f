"""The parts a broker hands out besides its transport (``aqw.brokers.base.Broker``): small
contracts, each one concern, each found as an attribute of the broker (a lookup, never a
call through the broker).

====================  ==============================  =========================================
attribute             part                            what needs it
====================  ==============================  =========================================
``broker.records``    ``JobRecords``                  ``app.job``, results, ``app.cancel``, waits
``broker.status``     ``WorkerStatus``                ``aqw status``, the monitor, the dashboard
``broker.marks``      ``ScheduleMarks``               periodic tasks (cron)
``broker.history``    ``DepthHistory`` or None        the dashboard's depth chart, delayed page
``broker.debounce``   ``Debounce`` or None            ``enqueue(..., debounce=s)``
``broker.flow_limits`` ``FlowLimits`` or None         rate limits, per-key caps (start step)
``broker.server``     ``ServerInfo`` or None          the dashboard's health box, ``aqw bench``
``broker.batches``    ``BatchCounts`` or None         ``app.batch``: a batch's counts, callbacks
``broker.control``    ``QueueControl`` or None        pause, the waiting list, delete, promote
``broker.rates``      ``JobRates`` or None            the dashboard's rates and per-task durations
====================  ==============================  =========================================

Every part says whether it is ``shared``: True when every process that opens the queue sees
the same state (a server holds it), False when it lives in this process only. A worker
refuses, at its start, a feature that needs a shared part the broker keeps in-process only
(``aqw.worker`` names the part and the fix), unless the whole queue lives in the process
(``Broker.in_process``: the memory broker). A composite broker hands out the part of the
broker that holds it (partition 0's status, the home queue's marks), never a copy.

The in-process implementations of every part are in ``aqw.brokers.local``; a broker
written outside aqw may use them (and says ``shared = False`` by using them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..job import Job
from ..record import DEFAULT_KEEP_FOR, JobInfo
from .batching import BatchInfo, BatchSpec
from .messages import (
    BlockedLease,
    CancelOutcome,
    DelayedJob,
    DepthSample,
    Release,
    ScheduleMark,
    WaitingJob,
)
from .tallies import TaskTally

__all__ = [
    "PART_NAMES",
    "BatchCounts",
    "Debounce",
    "DepthHistory",
    "FlowLimits",
    "JobRates",
    "JobRecords",
    "Part",
    "QueueControl",
    "ScheduleMarks",
    "ServerInfo",
    "StartLimits",
    "WorkerStatus",
]

#: Each part's attribute and what a person calls what it keeps (for messages).
PART_NAMES = {
    "records": "job records",
    "status": "worker heartbeats",
    "marks": "schedule marks",
    "history": "depth history",
    "debounce": "debounced jobs",
    "flow_limits": "rate limits and per-key caps",
    "server": "server information",
    "batches": "batch counts",
    "control": "queue pause and the waiting list",
    "rates": "throughput and duration history",
}


class Part(Protocol):
    """What every part says about itself."""

    #: True: every process that opens the queue sees the same (a server holds it);
    #: False: kept in this process only.
    @property
    def shared(self) -> bool: ...


class JobRecords(Part, Protocol):
    """A job's record (``aqw/record.py``) from enqueue to its end, the running jobs' states,
    cancellation, and waiting for a job to end. A broker whose records are shared writes
    them in the same atomic steps that move the job (publish, the start step, each settle);
    one that keeps them in the process hands out ``aqw.brokers.local.LocalJobRecords``, and
    ``Broker``'s settle steps keep them (``Broker.ack`` and the others)."""

    async def record(self, job_id: str) -> JobInfo | None:
        """The job's record, or None when there is none (unknown id, or expired)."""
        ...

    async def cancel(self, job_id: str, keep_for: float = DEFAULT_KEEP_FOR) -> CancelOutcome:
        """Cancel a job: ``"cancelled"`` (not started: its start step refuses it from now
        on), ``"cancelling"`` (running: asked to stop, ``cancel_requested``), ``"finished"``
        (it had ended: nothing changes) or ``"unknown"`` (no record of it)."""
        ...

    async def cancel_requested(self, job_id: str) -> bool:
        """True when ``cancel`` asked the running job ``job_id`` to stop (the worker checks
        at every lease renewal)."""
        ...

    async def wait_finished(self, job_id: str, timeout: float | None) -> JobInfo:
        """The job's record once it has ended, waiting up to ``timeout`` seconds (None: no
        limit) without polling. Raises ``aqw.UnknownJob`` (no record) or ``TimeoutError``."""
        ...

    async def set_running_state(self, job_id: str, state: dict[str, str]) -> None:
        """Write ``state``'s progress, message and lease expiry into the job's record while
        it runs under ``state["fencing_token"]`` (never into a finished record, nor into one
        another holder runs now)."""
        ...

    async def running_state(self, job_id: str) -> dict[str, str] | None:
        """The state of a running job (the shape of ``RunningJob.state``), or None."""
        ...

    async def running_states(self, limit: int = 1000) -> list[dict[str, str]]:
        """The states of up to ``limit`` running jobs, oldest start first. A job whose worker
        died stays listed, its lease expiry in the past, until another worker takes it over."""
        ...


class WorkerStatus(Part, Protocol):
    """The workers' (and monitors') heartbeats: what ``aqw status`` and the monitor read."""

    async def publish_heartbeat(self, worker: str, data: dict[str, Any], ttl: float) -> None:
        """Publish a worker's summary for ``ttl`` seconds."""
        ...

    async def heartbeats(self) -> list[dict[str, Any]]:
        """The summaries published recently (a damaged one as ``damaged_heartbeat``)."""
        ...

    async def remove_heartbeat(self, worker: str) -> None:
        """Withdraw a stopped worker's summary."""
        ...


class ScheduleMarks(Part, Protocol):
    """Per periodic task, the last tick its scheduler handled, so a new leader resumes where
    the last one stopped."""

    async def read(self) -> dict[str, ScheduleMark]:
        """Every task's mark (``aqw cron list`` reads them too)."""
        ...

    async def advance(self, task: str, mark: ScheduleMark) -> None:
        """Record ``mark`` as ``task``'s last tick, unless a later tick is recorded (a paused
        ex-leader that wakes up never moves a mark back)."""
        ...


class DepthHistory(Part, Protocol):
    """What the dashboard reads besides ``depth()``: one depth sample per ``DEPTH_BUCKET``
    seconds (written with the workers' heartbeats, kept ``DEPTH_KEEP`` seconds) and one page
    of the delayed set."""

    async def sample(self, at: float) -> None:
        """Record the queue's depth for the bucket of ``at`` unless that bucket has a sample
        (called with each heartbeat: one sample per bucket whatever the number of workers).
        Never raises for damaged state: a heartbeat must not fail for a chart."""
        ...

    async def since(self, at: float) -> list[DepthSample]:
        """The samples taken at or after ``at``, oldest first (at most ``DEPTH_SAMPLES``)."""
        ...

    async def delayed_page(self, start: int, count: int) -> list[DelayedJob]:
        """Up to ``count`` delayed (and retrying) jobs, soonest due first, after ``start``."""
        ...


class Debounce(Part, Protocol):
    """Debounced enqueue (``enqueue(..., key=k, debounce=s)``): a burst of enqueues of one
    key runs one job, with the last payload."""

    async def publish(
        self, job: Job, debounce: float, debounce_max: float | None
    ) -> tuple[str, bool]:
        """Enqueue ``job`` (with a ``key`` and the ``aqw-debounce`` header):
        while the job of ``job.key`` still waits in the delayed set, replace its payload and
        headers and move its start to ``aqw.flow.due_time(...)``, keeping its id, atomically;
        else schedule ``job`` itself ``debounce`` seconds from now. Returns (the waiting
        job's id, True when an earlier job was replaced)."""
        ...


class FlowLimits(Part, Protocol):
    """What the start step (``Broker.job_lease_backend(job, limits)``) enforces: rate limits
    (GCRA buckets) and per-key caps (counted over the holders' live leases), refusing a start
    over them with ``aqw.RateLimited`` and taking nothing. ``shared``: enforced across every
    worker of the queue, not per process."""

    @property
    def options(self) -> frozenset[str]:
        """The task options enforced, by name (``rate_limit``, ``max_per_key``)."""
        ...


@dataclass(frozen=True, slots=True)
class StartLimits:
    """A ``FlowLimits`` whose start step enforces every option."""

    shared: bool
    options: frozenset[str] = frozenset({"rate_limit", "max_per_key"})


class ServerInfo(Part, Protocol):
    """The server a broker's queue lives on, for operators: its memory, damage in the
    queue's own keys, and what ``aqw bench`` counts and cleans up."""

    async def health(self) -> dict[str, Any]:
        """Used, peak and max memory and the eviction policy (``used``, ``peak``, ``max``,
        ``policy``, ``evicting``, and ``error`` None); raises when the server cannot say."""
        ...

    async def problems(self) -> list[str]:
        """Damage in the queue's own state that stops its work, one line each."""
        ...

    async def commands_run(self) -> int | None:
        """Commands the server has run so far (None when it cannot tell)."""
        ...

    async def count_keys(self) -> int:
        """How many keys the queue has on the server (``aqw bench`` wants an unused queue)."""
        ...

    async def delete_queue(self) -> int:
        """Delete everything the queue keeps on the server; how many keys went."""
        ...

    async def blocked_leases(
        self, lease_ttl: Callable[[Job | None], float], limit: int = 20
    ) -> list[BlockedLease]:
        """Up to ``limit`` jobs blocked by a lease key that no live worker holds (damaged or
        forged state), longest blocked first; ``lease_ttl``: a job's lease TTL."""
        ...

    async def release_lease(self, job_id: str) -> Release:
        """Delete job ``job_id``'s lease key, only if no live worker holds it and it still
        holds the token read first (``aqw job release``): never done silently."""
        ...


class BatchCounts(Part, Protocol):
    """A batch's children and counts (``aqw.brokers.batching``). The counting itself is not a
    method: a broker's settle steps count a child (found by its record or its job id) once,
    in the same atomic step as its own settle, by its membership in the batch's set of
    unfinished children, and the step that brings a sealed batch to zero enqueues its
    callbacks under their idempotency keys (``batch:<id>:<kind>``), in that same step.
    Every key of a batch lives where its queue's keys live (Redis: the queue's slot)."""

    async def open(self, spec: BatchSpec) -> None:
        """Create batch ``spec.id``, open (children may be added; it cannot complete), with
        its callbacks' jobs; when ``spec.parent`` is set, the new batch is added to that
        (open) batch as one child in the same step."""
        ...

    async def add(self, batch_id: str, jobs: list[Job]) -> None:
        """Enqueue ``jobs`` now as children of the open batch ``batch_id``, each one and its
        membership in one atomic step (a child is never queued uncounted). Raises
        ``aqw.ConfigError`` naming the batch when it is sealed or unknown: nothing written."""
        ...

    async def seal(self, batch_id: str) -> BatchInfo:
        """Seal the batch: no child can be added from now on; when none is unfinished, the
        batch completes in this step (its callbacks enqueued). Its state after the step."""
        ...

    async def info(self, batch_id: str) -> BatchInfo | None:
        """The batch's counts now, or None (unknown id, or expired)."""
        ...

    async def children(self, batch_id: str, start: int, count: int) -> list[str]:
        """Up to ``count`` of the batch's children's job ids from position ``start``, in the
        order they were added (a nested batch is named ``batch:<id>``)."""
        ...

    async def cancel(self, batch_id: str) -> BatchInfo | None:
        """Cancel the batch's children that have not started (counted cancelled at once),
        ask the running ones to stop, seal it: its callbacks fire once the rest are final."""


class QueueControl(Part, Protocol):
    """What an operator does to a queue (``aqw queue``, the dashboard): pause and resume
    it (workers stop fetching from a paused queue: they read ``paused`` about once a
    second, never per job), list its waiting jobs per priority level, delete a waiting job
    and run a delayed one now."""

    async def pause(self) -> bool:
        """Pause the queue; False when it was paused already."""
        ...

    async def resume(self) -> bool:
        """Resume the queue; False when it was not paused."""
        ...

    async def paused(self) -> bool:
        """True while the queue is paused (one cheap read)."""
        ...

    async def waiting_counts(self) -> dict[int, int]:
        """Jobs waiting (not yet delivered) per priority level in use, level 0 always."""
        ...

    async def waiting_page(self, level: int, after: str | None, count: int) -> list[WaitingJob]:
        """Up to ``count`` waiting jobs of ``level``, oldest first, after entry ``after``."""
        ...

    async def delete_waiting(self, level: int, entry_id: str) -> bool:
        """Delete a waiting entry that no worker has taken; False when it is gone or was
        taken meanwhile (a running job is cancelled, not deleted)."""
        ...

    async def promote(self, job_id: str) -> bool:
        """Make the delayed job ``job_id`` due now (the workers move it to the queue on
        their next pass); False when no delayed job has that id."""
        ...

    async def find(self, job_id: str) -> bytes | None:
        """The wire form of job ``job_id`` while it waits, runs or is delayed (a bounded
        search: the first few thousand of each), or None."""
        ...


class JobRates(Part, Protocol):
    """Throughput, failures and durations per task over time, kept bounded: per-minute
    buckets for ``MINUTE_KEEP`` seconds and per-hour buckets for ``HOUR_KEEP`` seconds.
    Workers add what they counted in their heartbeat (one write per heartbeat, never one
    per job)."""

    async def add(self, tallies: dict[float, dict[str, TaskTally]]) -> None:
        """Add each minute's tallies (minute start -> task -> tally) to its minute bucket
        and to the hour bucket holding it."""
        ...

    async def read(self, since: float, hourly: bool) -> dict[float, dict[str, TaskTally]]:
        """The buckets (minute or hour start -> task -> tally) from ``since`` on."""
        ...
