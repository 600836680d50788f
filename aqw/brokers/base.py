"""The broker contract: what the runtime needs from a queue, whatever holds it.

A broker moves opaque job bytes and knows nothing of tasks or the runtime: it publishes, hands
out deliveries and settles them (ack, retry later, dead-letter, give back), atomically on its side.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from ..errors import ConfigError
from ..job import Job
from ..lease import Lease, LeaseBackend
from ..record import DEFAULT_KEEP_FOR, JobInfo
from ._debounce import DebouncedPublish
from ._flow import FlowSteps
from ._levels import PriorityShare
from ._local_records import CancelOutcome, LocalRecords
from ._local_start import LocalStartGuard
from ._local_status import LocalStatus
from ._schedule_marks import ScheduleMarks
from ._views import BrokerViews
from .messages import DeadJob, Delivery, Failure, Finish, QueueDepth, failure_fields

__all__ = [
    "Broker",
    "DeadJob",
    "Delivery",
    "Failure",
    "Finish",
    "QueueDepth",
    "failure_fields",
]


class Broker(ScheduleMarks, BrokerViews, DebouncedPublish, PriorityShare, FlowSteps, abc.ABC):
    """A queue the runtime consumes from. One instance serves one queue."""

    #: ``messaging.system`` for telemetry.
    system: str = "unknown"

    #: Errors that mean "the broker is unreachable right now": the worker retries them with
    #: backoff instead of failing a job. Brokers add their client library's classes.
    transient_errors: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError, OSError)

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.consumer = ""
        #: Worker heartbeats, for brokers with no shared store for them.
        self.local_status = LocalStatus()
        #: Job records, for brokers with no shared store for them (SQS): only this
        #: process's jobs, and only while it lives.
        self.local_records = LocalRecords(queue)

    def describe(self) -> str:
        """Where this broker is, for a log line: the system and the queue, never a secret
        (brokers with a host name it, e.g. ``redis://host:6379/0 queue=q``)."""
        return f"{self.system} queue={self.queue}"

    # -- lifecycle -------------------------------------------------------------------------

    @abc.abstractmethod
    async def connect(self) -> None:
        """Open connections and create what the queue needs (idempotent)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close connections. Unsettled deliveries stay with the broker for redelivery."""

    async def start_consuming(self, consumer: str) -> None:
        """Register this process as consumer ``consumer``."""
        self.consumer = consumer

    def expect_lease_ttl(self, seconds: float) -> None:
        """The longest job lease the runtime will take (a hint for brokers whose delivery
        is itself a lease, such as SQS visibility). Others ignore it."""
        return None

    # -- producing -------------------------------------------------------------------------

    @abc.abstractmethod
    async def publish(self, jobs: Sequence[Job]) -> None:
        """Make ``jobs`` available now, in one round trip where the broker allows."""

    @abc.abstractmethod
    async def schedule(self, jobs: Sequence[Job], run_at: float) -> None:
        """Make ``jobs`` available at ``run_at`` (seconds since the epoch)."""

    @property
    def keyed_enqueue(self) -> bool:
        """True when ``publish_unique`` (enqueue with an idempotency key) works here."""
        return type(self).publish_unique is not Broker.publish_unique

    async def publish_unique(self, job: Job, ttl: float, run_at: float | None) -> tuple[str, bool]:
        """Enqueue ``job`` unless a job with its idempotency key (``job.key``) was enqueued
        within ``ttl`` seconds; the check and the write are atomic. Returns (the job id that
        holds the key, True when it was a duplicate and nothing was written)."""
        raise ConfigError(
            f"the {type(self).__name__} broker cannot enqueue with an idempotency key atomically"
        )

    # -- consuming -------------------------------------------------------------------------

    @abc.abstractmethod
    async def fetch(self, count: int, block: float) -> list[Delivery]:
        """Up to ``count`` new deliveries, waiting up to ``block`` seconds for the first."""

    async def reclaim(
        self, count: int, lease_ttl: Callable[[Job | None], float], min_idle: float
    ) -> list[Delivery]:
        """Deliveries left unsettled by a consumer that stopped. An entry is claimed once it has
        been idle (no keep_alive from its holder) for at least its own job's lease TTL,
        ``lease_ttl(job)`` seconds (``job`` is None when the entry does not decode), AND,
        atomically with the claim, its job's lease key does not exist (a live holder whose
        lease is still held is never robbed). ``min_idle`` is the smallest TTL lease_ttl can
        return: entries idle less than that are not even looked at. At most ``count`` are
        claimed; each claim counts as one more delivery. Brokers whose deliveries time out
        by themselves (SQS visibility) recover nothing here."""
        return []

    async def give_back_unstarted(self, running: set[str]) -> int:
        """Hand back for immediate redelivery the deliveries this consumer holds that are
        not in ``running`` (delivery ids): e.g. a fetch cancelled by a shutdown after the
        broker had already handed it entries. Returns how many were given back. Brokers
        whose deliveries time out by themselves and quickly (SQS) need not override it."""
        return 0

    async def promote_due(self) -> float | None:
        """Move due scheduled jobs into the queue; seconds until the next is due, or None."""
        return None

    @abc.abstractmethod
    def lease_backend(self) -> LeaseBackend:
        """The backend for job leases and handler locks on this broker."""

    def job_lease_key(self, job: Job) -> str:
        """The lease key guarding ``job``."""
        return f"aqw:{{{self.queue}}}:lease:{job.id}"

    def lock_key(self, name: str) -> str:
        """The lease key of the resource lock ``name`` (``ctx.lock(name)``) on this queue."""
        return f"aqw:{{{self.queue}}}:lock:{name}"

    @abc.abstractmethod
    async def keep_alive(self, delivery: Delivery) -> bool:
        """Keep ``delivery`` ours while its job runs; False when it is no longer ours."""

    # -- settling (each atomic with the release of the job's lease) -------------------------

    @abc.abstractmethod
    async def ack(
        self,
        delivery: Delivery,
        job: Job | None,
        lease: Lease | None,
        record_ttl: float = 0.0,
        finish: Finish | None = None,
    ) -> bool:
        """The job ended: remove it for good, and when it has an idempotency key and
        ``record_ttl`` > 0, write its completion record for that many seconds, in the same
        step; its job record takes ``finish``'s state (default: succeeded) and wakes the
        callers waiting for its result. False when another holder owns it now."""

    @abc.abstractmethod
    async def retry(
        self,
        delivery: Delivery,
        job: Job,
        run_at: float,
        lease: Lease | None,
        failure: Failure | None = None,
    ) -> bool:
        """Replace the delivery with ``job`` (its next attempt) due at ``run_at``; the job's
        record reads ``retrying`` with ``failure`` as its last error."""

    @abc.abstractmethod
    async def dead_letter(
        self,
        delivery: Delivery,
        job: Job | None,
        failure: Failure,
        attempts: int,
        lease: Lease | None,
        keep_for: float = DEFAULT_KEEP_FOR,
    ) -> str | None:
        """Move the delivery to the dead-letter queue with ``failure`` recorded (``job`` is
        None when the message could not be decoded). The new DLQ entry's id (what
        ``dlq_get`` and ``aqw dlq show`` take), or None when another holder owns it now.
        The job's record reads ``dead`` (for ``keep_for`` seconds) and names the entry."""

    @abc.abstractmethod
    async def requeue(
        self, delivery: Delivery, lease: Lease | None, job: Job | None = None
    ) -> bool:
        """Give an unfinished delivery back for immediate redelivery (same attempt); the
        record of ``job``, when given and running, reads ``queued`` again."""

    async def defer(self, delivery: Delivery, job: Job, run_at: float, lease: Lease | None) -> bool:
        """Put ``job`` off until ``run_at`` without spending an attempt (a limit refused its
        start, or its handler raised ``aqw.RateLimited``), replacing the delivery in one step;
        its record reads ``delayed``. False when another holder owns it now. This default is
        a ``retry`` of the same attempt (its record reads ``retrying``)."""
        return await self.retry(delivery, job, run_at, lease)

    async def is_completed(self, job: Job) -> bool:
        """True when ``job``'s idempotency key has a completion record (it finished before)."""
        return False

    # -- job records (``aqw/record.py``): these defaults keep them in the process -----------
    # (``local_records``); brokers with a shared store write them in the same atomic steps
    # that move the job (publish, the lease taken by ``job_lease_backend``, ack, retry,
    # dead_letter, requeue) and override all of these and the running-job states below.

    def job_lease_backend(self, job: Job, delivery: Delivery | None = None) -> LeaseBackend:
        """The backend of ``job``'s own lease. Its ``acquire`` also marks the job running,
        in the same step, and raises ``aqw.JobCancelled`` (taking nothing) when the job
        was cancelled before it started. With ``delivery`` (the one being started), it
        raises ``StaleStart``, taking nothing, when the delivery is no longer this
        consumer's or the job has ended (a delivery of an ended job is dropped unrun).
        This default is ``local_start``'s."""
        return self.local_start(job, delivery)

    def local_start(self, job: Job, delivery: Delivery | None = None) -> LocalStartGuard:
        """``job_lease_backend`` for brokers whose job records are ``local_records``: the
        delivery is checked with ``keep_alive`` and dropped with an ``ack`` naming no job."""
        check = None if delivery is None else partial(self._still_ours, delivery)
        return LocalStartGuard(self.lease_backend(), self.local_records, job, self.consumer, check)

    async def _still_ours(self, delivery: Delivery, drop: bool) -> bool:
        """``LocalStartGuard``'s check of ``delivery``: True while it is ours; ``drop``: its
        job has ended, so settle it unrun (no record is touched)."""
        if drop:
            return await self.ack(delivery, None, None)
        return await self.keep_alive(delivery)

    async def record(self, job_id: str) -> JobInfo | None:
        """The job's record, or None when there is none (unknown id, or expired)."""
        return self.local_records.info(job_id)

    async def cancel(self, job_id: str, keep_for: float = DEFAULT_KEEP_FOR) -> CancelOutcome:
        """Cancel a job: ``"cancelled"`` (not started: it never will), ``"cancelling"``
        (running: its handler is stopped at its next lease renewal), ``"finished"`` (it had
        ended: nothing changes) or ``"unknown"`` (no record of it)."""
        return self.local_records.cancel(job_id, keep_for)

    async def cancel_requested(self, job_id: str) -> bool:
        """True when ``app.cancel`` asked for the running job ``job_id`` to stop."""
        return self.local_records.cancel_requested(job_id)

    async def wait_finished(self, job_id: str, timeout: float | None) -> JobInfo:
        """The job's record once it has ended, waiting up to ``timeout`` seconds (None: no
        limit) without polling. Raises ``aqw.UnknownJob`` (no record) or ``TimeoutError``."""
        return await self.local_records.wait(job_id, timeout)

    # -- running-job states (shaped as ``RunningJob.state``), read from the records: a job runs
    # while its record says so (after its worker died, until another takes it over)

    async def set_job_state(self, job_id: str, state: dict[str, str], ttl: float) -> None:
        """Write ``state``'s progress, message and lease expiry into the job's record while
        it runs under ``state``'s fencing token (never a finished record); ``ttl`` unused."""
        self.local_records.set_running_state(job_id, state)

    async def clear_job_state(self, job_id: str) -> None:
        """Nothing to do: the job's end (ack, retry, ...) moved its record on."""
        return None

    async def job_state(self, job_id: str) -> dict[str, str] | None:
        """The state of a running job, or None."""
        return self.local_records.running_state(job_id)

    async def job_states(self, limit: int = 1000) -> list[dict[str, str]]:
        """The states of up to ``limit`` running jobs."""
        return self.local_records.running_states(limit)

    # -- worker heartbeats (what `aqw status` and the monitor read) -------------------------

    async def publish_heartbeat(self, worker: str, data: dict[str, Any], ttl: float) -> None:
        """Publish a worker's summary for ``ttl`` seconds. This default keeps it in the
        broker object; shared brokers store it centrally so any process can read it."""
        self.local_status.publish_heartbeat(worker, data, ttl)

    async def heartbeats(self) -> list[dict[str, Any]]:
        """The summaries of the workers that published one recently."""
        return self.local_status.heartbeats()

    async def remove_heartbeat(self, worker: str) -> None:
        """Withdraw a stopped worker's summary."""
        self.local_status.remove_heartbeat(worker)

    # -- inspection ------------------------------------------------------------------------

    @abc.abstractmethod
    async def depth(self) -> QueueDepth:
        """Counts of waiting, in-flight, delayed and dead jobs."""

    async def stats(self) -> dict[str, int]:
        """Lifetime counters kept by the broker (processed, retried, dead, ...)."""
        return {}

    # -- dead-letter queue -----------------------------------------------------------------

    @abc.abstractmethod
    async def dlq_list(self, count: int = 100, after: str | None = None) -> list[DeadJob]:
        """Dead jobs, oldest first, starting after entry ``after``."""

    @abc.abstractmethod
    async def dlq_get(self, entry_id: str) -> DeadJob | None:
        """One dead job by its DLQ entry id."""

    @abc.abstractmethod
    async def dlq_replay(self, entries: Sequence[tuple[str, Job]]) -> int:
        """Put the given (DLQ entry id, job) pairs back on the queue and remove them from
        the DLQ atomically; returns how many were replayed."""

    @abc.abstractmethod
    async def dlq_delete(self, entry_ids: Sequence[str]) -> int:
        """Delete DLQ entries; returns how many existed."""
