"""The parts that keep a queue's state for readers: job records, heartbeats, schedule marks, depth
history, the server's information."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Protocol, runtime_checkable

from ...job import Job
from ...record import DEFAULT_KEEP_FOR, JobInfo
from ..messages import (
    BlockedLease,
    CancelOutcome,
    DelayedJob,
    DepthSample,
    Release,
    ScheduleMark,
)
from ._part import Part


class JobRecords(Part, Protocol):
    """A job's record (``aqw/record.py``) from enqueue to its end, the running jobs' states,
    cancellation, and waiting for a job to end. A broker whose records are shared writes
    them in the same atomic steps that move the job (publish, the start step, each settle);
    one that keeps them in the process hands out ``aqw.brokers.local.LocalJobRecords``, and
    ``Broker``'s settle steps keep them (``Broker.ack`` and the others)."""

    async def record(self, job_id: str) -> JobInfo | None:
        """The job's record, or None when there is none (unknown id, or expired)."""

    async def cancel(self, job_id: str, keep_for: float = DEFAULT_KEEP_FOR) -> CancelOutcome:
        """Cancel a job: ``"cancelled"`` (not started: its start step refuses it from now
        on), ``"cancelling"`` (running: asked to stop, ``cancel_requested``), ``"finished"``
        (it had ended: nothing changes) or ``"unknown"`` (no record of it)."""

    async def cancel_requested(self, job_id: str) -> bool:
        """True when ``cancel`` asked the running job ``job_id`` to stop (the worker checks
        at every lease renewal)."""

    async def wait_finished(self, job_id: str, timeout: float | None) -> JobInfo:
        """The job's record once it has ended, waiting up to ``timeout`` seconds (None: no
        limit) without polling. Raises ``aqw.UnknownJob`` (no record) or ``TimeoutError``."""

    async def set_running_state(self, job_id: str, state: dict[str, str]) -> None:
        """Write ``state``'s progress, message and lease expiry into the job's record while
        it runs under ``state["fencing_token"]`` (never into a finished record, nor into one
        another holder runs now)."""

    async def running_state(self, job_id: str) -> dict[str, str] | None:
        """The state of a running job (the shape of ``RunningJob.state``), or None."""

    async def running_states(self, limit: int = 1000) -> list[dict[str, str]]:
        """The states of up to ``limit`` running jobs, oldest start first. A job whose worker
        died stays listed, its lease expiry in the past, until another worker takes it over."""


@runtime_checkable
class SharedResults(Protocol):
    """What job records kept in the process (``shared = False``) may add: the final records
    of the tasks named written to a store every process reads (SQS with ``records=redis://``),
    so results (``keep_result``) are shared although the rest of the records is not. The
    worker checks it at its start and names the tasks that keep results."""

    @property
    def results_shared(self) -> bool: ...

    def keep_results_of(self, tasks: Collection[str]) -> None:
        """The tasks whose final records (and results) go to the shared store."""


class WorkerStatus(Part, Protocol):
    """The workers' (and monitors') heartbeats: what ``aqw status`` and the monitor read."""

    async def publish_heartbeat(self, worker: str, data: dict[str, Any], ttl: float) -> None:
        """Publish a worker's summary for ``ttl`` seconds."""

    async def heartbeats(self) -> list[dict[str, Any]]:
        """The summaries published recently (a damaged one as ``damaged_heartbeat``)."""

    async def remove_heartbeat(self, worker: str) -> None:
        """Withdraw a stopped worker's summary."""


class ScheduleMarks(Part, Protocol):
    """Per periodic task, the last tick its scheduler handled, so a new leader resumes where
    the last one stopped."""

    async def read(self) -> dict[str, ScheduleMark]:
        """Every task's mark (``aqw cron list`` reads them too)."""

    async def advance(self, task: str, mark: ScheduleMark) -> None:
        """Record ``mark`` as ``task``'s last tick, unless a later tick is recorded (a paused
        ex-leader that wakes up never moves a mark back)."""


class DepthHistory(Part, Protocol):
    """What the dashboard reads besides ``depth()``: one depth sample per ``DEPTH_BUCKET``
    seconds (written with the workers' heartbeats, kept ``DEPTH_KEEP`` seconds) and one page
    of the delayed set."""

    async def sample(self, at: float) -> None:
        """Record the queue's depth for the bucket of ``at`` unless that bucket has a sample
        (called with each heartbeat: one sample per bucket whatever the number of workers).
        Never raises for damaged state: a heartbeat must not fail for a chart."""

    async def since(self, at: float) -> list[DepthSample]:
        """The samples taken at or after ``at``, oldest first (at most ``DEPTH_SAMPLES``)."""

    async def delayed_page(self, start: int, count: int) -> list[DelayedJob]:
        """Up to ``count`` delayed (and retrying) jobs, soonest due first, after ``start``."""


class ServerInfo(Part, Protocol):
    """The server a broker's queue lives on, for operators: its memory, damage in the
    queue's own keys, and what ``aqw bench`` counts and cleans up."""

    async def health(self) -> dict[str, Any]:
        """Used, peak and max memory and the eviction policy (``used``, ``peak``, ``max``,
        ``policy``, ``evicting``, and ``error`` None); raises when the server cannot say."""

    async def problems(self) -> list[str]:
        """Damage in the queue's own state that stops its work, one line each."""

    async def commands_run(self) -> int | None:
        """Commands the server has run so far (None when it cannot tell)."""

    async def count_keys(self) -> int:
        """How many keys the queue has on the server (``aqw bench`` wants an unused queue)."""

    async def delete_queue(self) -> int:
        """Delete everything the queue keeps on the server; how many keys went."""

    async def blocked_leases(
        self, lease_ttl: Callable[[Job | None], float], limit: int = 20
    ) -> list[BlockedLease]:
        """Up to ``limit`` jobs blocked by a lease key that no live worker holds (damaged or
        forged state), longest blocked first; ``lease_ttl``: a job's lease TTL."""

    async def release_lease(self, job_id: str) -> Release:
        """Delete job ``job_id``'s lease key, only if no live worker holds it and it still
        holds the token read first (``aqw job release``): never done silently."""
