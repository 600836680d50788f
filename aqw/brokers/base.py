"""The broker contract: what the runtime needs from a queue, whatever holds it.

``Broker`` is the transport: it publishes opaque job bytes, hands out deliveries, starts a
job under its lease, settles deliveries (ack, retry later, dead-letter, give back, put off)
atomically on its side, and counts what it holds. Everything else a queue keeps is a part
the broker hands out as an attribute (``aqw.brokers.parts``): job records, worker status,
schedule marks, depth history, debounce, flow limits, server information.

The settle steps are public methods written once here, over a broker's ``_ack``,
``_retry``, ``_dead_letter``, ``_give_back`` and ``_defer``: a broker whose steps write its
job records itself (Redis: one script each) does nothing more; one that keeps them in the
process (``aqw.brokers.local.LocalJobRecords``) has them kept here, after its step.

``docs/brokers/writing-a-broker.md`` is the guide; ``aqw.testing.contract`` the tests.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from .._ids import new_job_id
from ..errors import ConfigError
from ..flow import Limits
from ..job import Job
from ..lease import Lease, LeaseBackend
from ..record import DEFAULT_KEEP_FOR
from .local.batches import LocalBatchCounts
from .local.records import LocalJobRecords
from .messages import (
    SUCCEEDED,
    DeadJob,
    Delivery,
    Failure,
    Finish,
    QueueDepth,
    failure_fields,
)
from .parts import (
    BatchCounts,
    Debounce,
    DepthHistory,
    FairShares,
    FlowLimits,
    JobRates,
    JobRecords,
    ProgressStream,
    QueueControl,
    RunLimits,
    ScheduleMarks,
    ServerInfo,
    WorkerStatus,
)

__all__ = [
    "DEFAULT_PRIORITY_SHARE",
    "MAX_PARTITIONS",
    "Broker",
    "DeadJob",
    "Delivery",
    "Failure",
    "Finish",
    "QueueDepth",
    "check_partitions",
    "check_priority_share",
    "failure_fields",
]

#: The default share of fetches that start from the lowest waiting priority level.
DEFAULT_PRIORITY_SHARE = 0.05

#: Most partitions of one queue.
MAX_PARTITIONS = 1024


def check_priority_share(share: object) -> float:
    """``share`` as a float in [0, 1], or a ``ConfigError`` naming ``priority_share``."""
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 1:
        raise ConfigError(
            f"worker priority_share must be a fraction from 0 (strict order) to 1, got {share!r}"
        )
    return float(share)


def check_partitions(value: object) -> int:
    """``partitions=`` when it is an integer from 1 to ``MAX_PARTITIONS``, else a
    ConfigError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PARTITIONS:
        raise ConfigError(
            f"partitions must be an integer from 1 to {MAX_PARTITIONS}, got {value!r}"
        )
    return value


class Broker(abc.ABC):
    """A queue the runtime consumes from: the transport, and the parts it hands out.

    One instance serves one queue. A subclass passes every part to ``__init__``: job
    ``records``, worker ``status`` and schedule ``marks`` always (each saying whether it is
    shared across processes), and ``history``, ``debounce``, ``flow_limits`` and ``server``
    when it has them (None: the broker has no such thing, and the features that need it are
    refused with a message naming it)."""

    #: ``messaging.system`` for telemetry.
    system: str = "unknown"

    #: Errors that mean "the broker is unreachable right now": the worker retries them with
    #: backoff instead of failing a job. Brokers add their client library's classes.
    transient_errors: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError, OSError)

    #: True when the whole queue lives in this process (the memory broker): its parts are as
    #: shared as the queue itself, so the features that need shared parts are allowed.
    in_process: bool = False

    #: Seconds after a retry comes due during which ``depth()`` may still count it nowhere
    #: (neither delayed, waiting nor in flight): 0 where a retry moves in one atomic step
    #: and the counts are exact. A burst worker does not believe an empty queue that soon
    #: after its own latest retry came due.
    depth_lag: float = 0.0

    #: Seconds a delivery stays this consumer's after its last ``keep_alive`` when the broker
    #: fixes that window whatever the lease TTL (NATS's AckWait set in the URL); None: the
    #: lease's TTL decides. A job's lease renews (and keeps its delivery alive) at least
    #: every third of it.
    delivery_window: float | None = None

    #: True when a job's id says where the job lives (a partitioned queue): the producer
    #: then takes each job's id from ``job_id_for``.
    routes_jobs: bool = False

    #: Fair shares between the keys of the queue (``fairness_key``); None: refused at
    #: enqueue. A class attribute, so a broker without them passes nothing.
    fair_shares: FairShares | None = None

    #: Progress updates as a stream per job (``app.progress``); None: not streamed.
    progress: ProgressStream | None = None

    #: Limits changed at run time (``aqw limits``); None: the tasks' own limits only.
    run_limits: RunLimits | None = None

    def __init__(
        self,
        queue: str,
        *,
        records: JobRecords,
        status: WorkerStatus,
        marks: ScheduleMarks,
        history: DepthHistory | None = None,
        debounce: Debounce | None = None,
        flow_limits: FlowLimits | None = None,
        server: ServerInfo | None = None,
        batches: BatchCounts | None = None,
        control: QueueControl | None = None,
        rates: JobRates | None = None,
    ) -> None:
        self.queue = queue
        self.consumer = ""
        #: Job records (``app.job``, results, ``app.cancel``, the running jobs).
        self.records = records
        #: Worker heartbeats (``aqw status``, the monitor).
        self.status = status
        #: The periodic tasks' last ticks.
        self.marks = marks
        #: The depth history and the delayed page (the dashboard); None: none kept.
        self.history = history
        #: Debounced enqueue; None: refused at enqueue.
        self.debounce = debounce
        #: What the start step enforces; None: rate limits and caps are refused.
        self.flow_limits = flow_limits
        #: The server the queue lives on; None: no server to show.
        self.server = server
        #: Batches (``app.batch``); None: refused. Its counts move in the settle steps.
        self.batches = batches
        #: Pause/resume, the waiting list, delete and promote; None: not offered.
        self.control = control
        #: Throughput and durations over time (the dashboard); None: none kept.
        self.rates = rates
        #: The records the settle steps below keep, when the broker's own steps do not.
        self._book = records if isinstance(records, LocalJobRecords) else None
        #: The batch counts the settle steps below make, when the broker's own do not.
        self._tally = batches if isinstance(batches, LocalBatchCounts) else None

    def describe(self) -> str:
        """Where this broker is, for a log line: the system and the queue, never a secret
        (brokers with a host name it, e.g. ``redis://host:6379/0 queue=q``)."""
        where = f"{self.system} queue={self.queue}"
        return f"{where} (in-process only)" if self.in_process else where

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

    def sibling(self, queue: str) -> Broker:
        """The broker of another queue beside this one, on the same connection (what
        ``app.broker_for`` and a worker of several queues use)."""
        raise ConfigError(
            f"queue: cannot open queue {queue!r} beside a {type(self).__name__}: give the "
            "App a broker URL"
        )

    # -- producing -------------------------------------------------------------------------

    @abc.abstractmethod
    async def publish(self, jobs: Sequence[Job]) -> None:
        """Make ``jobs`` available now, in one round trip where the broker allows; each
        job's record reads ``queued``."""

    @abc.abstractmethod
    async def schedule(self, jobs: Sequence[Job], run_at: float) -> None:
        """Make ``jobs`` available at ``run_at`` (seconds since the epoch); each job's record
        reads ``delayed`` (``queued`` when ``run_at`` has passed)."""

    def job_id_for(self, route: str | None) -> str:
        """A new job id for a job whose route (``aqw.flow.route_key``) is ``route``: only a
        broker that ``routes_jobs`` puts the route into the id."""
        return new_job_id()

    @property
    def keyed_enqueue(self) -> bool:
        """True when ``publish_unique`` (enqueue with an idempotency key) works here."""
        return type(self).publish_unique is not Broker.publish_unique

    async def publish_unique(self, job: Job, ttl: float, run_at: float | None) -> tuple[str, bool]:
        """Enqueue ``job`` unless a job with its idempotency key (``job.key``) was enqueued
        within ``ttl`` seconds, or finished with a completion record; the check and the
        write are atomic. Returns (the job id that holds the key, True when it was a
        duplicate and nothing was written)."""
        raise ConfigError(
            f"the {type(self).__name__} broker cannot enqueue with an idempotency key atomically"
        )

    async def is_completed(self, job: Job) -> bool:
        """True when ``job``'s idempotency key has a completion record (it finished before;
        ``aqw.flow.completion_key``: a debounce key has none)."""
        return False

    # -- consuming -------------------------------------------------------------------------

    @abc.abstractmethod
    async def fetch(self, count: int, block: float, share: float = 0.0) -> list[Delivery]:
        """Up to ``count`` new deliveries, waiting up to ``block`` seconds for the first
        (``block`` <= 0: not at all), highest priority level first. ``share``: about that
        fraction of the fetches that find several levels waiting start from the lowest
        waiting level instead (0: strict order; ``aqw.brokers.local.ShareCredit`` counts
        the turns). Each delivery counts as one more delivery of its job."""

    async def fetch_together(
        self, queues: Sequence[Broker], consumer: str, count: int, block: float
    ) -> list[tuple[int, Delivery]] | None:
        """Up to ``count`` new deliveries of ``queues`` (this broker among them) in one
        blocking read as ``consumer``: (the index of its queue, the delivery). None when this
        family cannot wait on those queues at once; a multi-queue worker then waits on
        each in turn."""
        return None

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
    async def keep_alive(self, delivery: Delivery) -> bool:
        """Keep ``delivery`` ours while its job runs; False when it is no longer ours."""

    #: True when ``watch_cancels`` pushes a running job's cancel to its worker at once.
    pushes_cancels: bool = False

    async def watch_cancels(self, on_cancel: Callable[[str], None]) -> None:
        """Call ``on_cancel(job_id)`` as soon as ``records.cancel`` asks a running job of
        this queue to stop, until cancelled (a worker runs this for the whole of its run).
        This default returns at once: the broker has no way to push the word, and its
        workers read the request with each lease renewal (``records.cancel_requested``),
        within ttl/3."""
        return None

    # -- leases and the job's start ----------------------------------------------------------

    @abc.abstractmethod
    def lease_backend(self) -> LeaseBackend:
        """The backend of resource locks (``ctx.lock``) and the scheduler's and monitor's
        leases on this queue. Its fencing tokens strictly grow per key."""

    def job_lease_key(self, job: Job) -> str:
        """The lease key guarding ``job``."""
        return f"aqw:{{{self.queue}}}:lease:{job.id}"

    def lock_key(self, name: str) -> str:
        """The lease key of the resource lock ``name`` (``ctx.lock(name)``) on this queue."""
        return f"aqw:{{{self.queue}}}:lock:{name}"

    @abc.abstractmethod
    def job_lease_backend(
        self, job: Job, limits: Limits | None = None, delivery: Delivery | None = None
    ) -> LeaseBackend:
        """The backend of ``job``'s own lease: its ``acquire`` is the job's start step. In
        one atomic step it takes the lease (a fencing token greater than every one handed
        out for the key before) and marks the record running. A start is only for a live
        delivery: it takes nothing, and writes nothing, when another holder has the lease
        (None), when ``delivery`` (the one being started) is no longer this consumer's, or
        the job's record is final (``aqw.StaleStart``; a delivery of an ended job, still
        ours, is dropped unrun), when the job was cancelled (``aqw.JobCancelled``), or when
        ``limits`` (only given when ``flow_limits`` is set) refuse it now
        (``aqw.RateLimited``). ``renew`` moves the record's lease expiry on."""

    # -- settling: each atomic with the release of the job's lease ---------------------------

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
        end = SUCCEEDED if finish is None else finish
        if not await self._ack(delivery, job, lease, end, record_ttl):
            return False
        book = self._book
        if book is not None and job is not None:
            book.finish(job, end.state, end.fields(self.consumer, time.time()), end.keep_for)
            tally = self._tally
            if tally is not None and job.id in tally.counting:  # counted before any await
                await tally.settled(job.id, end.state)
        return True

    async def retry(
        self,
        delivery: Delivery,
        job: Job,
        run_at: float,
        lease: Lease | None,
        failure: Failure | None = None,
    ) -> bool:
        """Replace the delivery with ``job`` (its next attempt) due at ``run_at``; the job's
        record reads ``retrying`` with ``failure`` as its last error. False when another
        holder owns it now."""
        if not await self._retry(delivery, job, run_at, lease, failure):
            return False
        if self._book is not None:
            fields = failure_fields(failure) if failure is not None else {}
            self._book.retrying(job, run_at, fields)
        return True

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
        entry = await self._dead_letter(delivery, job, failure, attempts, lease, keep_for)
        if entry is not None and job is not None and self._book is not None:
            fields = Finish(failure=failure).fields(failure.worker or self.consumer, time.time())
            self._book.finish(job, "dead", {**fields, "dlq_entry": entry}, keep_for)
            tally = self._tally
            if tally is not None and job.id in tally.counting:  # counted before any await
                await tally.settled(job.id, "dead")
        return entry

    async def give_back(
        self, delivery: Delivery, lease: Lease | None, job: Job | None = None
    ) -> bool:
        """Give an unfinished delivery back for immediate redelivery (same attempt); the
        record of ``job``, when given and running, reads ``queued`` again."""
        if not await self._give_back(delivery, lease, job):
            return False
        if job is not None and self._book is not None:
            self._book.given_back(job.id)
        return True

    async def defer(self, delivery: Delivery, job: Job, run_at: float, lease: Lease | None) -> bool:
        """Put ``job`` off until ``run_at`` without spending an attempt (a limit refused its
        start, or its handler raised ``aqw.RateLimited``), replacing the delivery in one step;
        its record reads ``delayed``. False when another holder owns it now."""
        if not await self._defer(delivery, job, run_at, lease):
            return False
        if self._book is not None:
            self._book.deferred(job, run_at)
        return True

    def settle_in_transaction(
        self, delivery: Delivery, job: Job, lease: Lease, record_ttl: float, keep_for: float
    ) -> AbstractAsyncContextManager[Any]:
        """``ctx.transaction()``: a connection to the broker's own database whose transaction,
        at the block's clean end, also acks the job (succeeded, kept ``keep_for``), fenced by
        ``lease``: the handler's writes and the ack commit together or not at all. A broker
        with no such database refuses it in one line (this default)."""
        raise ConfigError(
            f"ctx.transaction() needs a broker whose jobs live in your database (PostgreSQL); "
            f"the {self.system} broker has none"
        )

    # The steps under the methods above: each one atomic step on the broker that releases
    # the job's lease with it, refused (False, or None for ``_dead_letter``), touching
    # nothing, when another holder owns the job now: its lease holds another token, or,
    # without a held lease, the delivery is no longer this consumer's.

    @abc.abstractmethod
    async def _ack(
        self,
        delivery: Delivery,
        job: Job | None,
        lease: Lease | None,
        finish: Finish,
        record_ttl: float,
    ) -> bool: ...

    @abc.abstractmethod
    async def _retry(
        self,
        delivery: Delivery,
        job: Job,
        run_at: float,
        lease: Lease | None,
        failure: Failure | None,
    ) -> bool: ...

    @abc.abstractmethod
    async def _dead_letter(
        self,
        delivery: Delivery,
        job: Job | None,
        failure: Failure,
        attempts: int,
        lease: Lease | None,
        keep_for: float,
    ) -> str | None: ...

    @abc.abstractmethod
    async def _give_back(
        self, delivery: Delivery, lease: Lease | None, job: Job | None
    ) -> bool: ...

    async def _defer(
        self, delivery: Delivery, job: Job, run_at: float, lease: Lease | None
    ) -> bool:
        """By default a ``_retry`` of the same attempt, with no error."""
        return await self._retry(delivery, job, run_at, lease, None)

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
        the DLQ atomically; each job's record reads ``queued`` again. Returns how many were
        replayed."""

    @abc.abstractmethod
    async def dlq_delete(self, entry_ids: Sequence[str]) -> int:
        """Delete DLQ entries; returns how many existed."""
