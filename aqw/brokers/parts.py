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
``broker.fair_shares`` ``FairShares`` or None         ``fairness_key`` (a class attribute: None
                                                      unless the broker picks by fair shares)
``broker.progress``   ``ProgressStream`` or None      ``app.progress(job_id)`` (a class attribute)
``broker.run_limits`` ``RunLimits`` or None           ``aqw limits``, ``app.limits`` (a class
                                                      attribute: None unless stored with the queue)
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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..job import Job
from ..record import DEFAULT_KEEP_FOR, JobInfo
from .messages import (
    BlockedLease,
    CancelOutcome,
    DelayedJob,
    DepthSample,
    Release,
    ScheduleMark,
)

__all__ = [
    "PART_NAMES",
    "Debounce",
    "DepthHistory",
    "FairShares",
    "FlowLimits",
    "JobRecords",
    "Part",
    "ProgressStream",
    "RunLimits",
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
    "fair_shares": "fair shares",
    "run_limits": "run-time limits",
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


class FairShares(Part, Protocol):
    """Fair shares between the keys of a queue (``@app.task(fairness_key=...)``): a job with
    a fairness key waits in its key's turn, and the fetch picks across the keys with jobs
    waiting (within each priority level) by start-time fair queueing on their weights, so a
    key that starts waiting is among the next (keys waiting) picks whatever another key
    holds (``docs/concepts/fairness.md``)."""

    async def publish(self, jobs: Sequence[Job]) -> None:
        """Enqueue ``jobs`` (each with ``fairness_key`` and ``fairness_weight``), due now,
        with their records, into their keys' turns."""
        ...


class ProgressStream(Part, Protocol):
    """A running job's progress updates (``ctx.progress``) as a bounded stream per job that
    readers follow (``app.progress``), best effort: a reader that lags past the kept updates
    loses the oldest."""

    async def publish(self, job_id: str, update: dict[str, str]) -> None:
        """Append ``update`` (``fraction``, ``message``, ``detail`` as JSON) to the job's
        stream."""
        ...

    async def read(
        self, job_id: str, after: str, block: float | None
    ) -> list[tuple[str, dict[str, str]]]:
        """The job's updates after the id ``after`` ("0": every one kept), oldest first,
        each (its id, its fields with ``at``), waiting up to ``block`` seconds for one."""
        ...


class RunLimits(Part, Protocol):
    """Rate limits and per-key caps changed at run time, stored with the queue: a map of
    ``rate:<task>`` (or ``rate:<task>:<key>``, one rate key's bucket) to a rate
    (``"20/s"``) and ``cap:<task>`` to a most-per-key count (``"3"``), over the values the
    tasks were registered with (``aqw.flow.with_overrides``)."""

    async def read(self) -> dict[str, str]:
        """The stored map."""
        ...

    async def write(self, name: str, value: str | None) -> None:
        """Store ``value`` under ``name`` (None: remove it)."""
        ...

    async def refresh(self) -> None:
        """Read the map into ``current`` now (a worker's start)."""
        ...

    def current(self) -> dict[str, str]:
        """The map as this process last read it, read again in the background (at most
        ``aqw.brokers.local.run_limits.REFRESH_EVERY`` seconds old)."""
        ...

    async def stop(self) -> None:
        """Stop the background reads."""
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
