"""The App: a task registry bound to a broker, the producer API and the embedding entry point."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Unpack, overload

from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from .._text import quoted
from ..brokers import Broker, from_url, with_partitions
from ..brokers.base import DEFAULT_PRIORITY_SHARE, check_partitions
from ..brokers.multi import check_queue
from ..errors import ConfigError, UnknownTask
from ..job import Job
from ..outbox import Outbox, as_outbox
from ..record import DEFAULT_KEEP_FOR, JobInfo
from ..retry import RetryPolicy
from ..task import Enqueued, Handler, Task
from ..telemetry import Telemetry
from ..worker import Worker
from ._arguments import check_app_options, check_task_name
from ._batches import batch_info, batch_results, flow_info_of, open_batch, start
from ._batches import cancel_batch as batch_cancel
from ._dlq import DeadLetters
from ._jobs import CancelOutcome, Jobs
from ._limits import RunTimeLimits
from ._producing import enqueue_jobs
from ._progress import follow
from ._queue_telemetry import QueueTelemetry
from ._registration import TaskSettings, task_options

if TYPE_CHECKING:  # the cache's module loads redis-py: an app with a cache has loaded it
    from ..cache import Cache

R = TypeVar("R")

#: The default ``max_payload_bytes``: 1 MiB of encoded job.
DEFAULT_MAX_PAYLOAD_BYTES = 1_048_576


class App:
    """A set of tasks on one queue.

    Args:
        broker: a broker URL (``memory://``, ``redis://host:6379/0``, ``sqs://queue?...``) or a
            ``aqw.brokers.Broker`` instance. Default: the in-process ``memory://``.
        queue: the queue name (default ``"default"``).
        retry: the default ``RetryPolicy`` of every task.
        lease_ttl: default seconds a job's lease lives between renewals.
        timeout: default seconds a handler may run (None: no limit).
        max_deliveries: deliveries without a settle (e.g. the worker crashed mid-job each time)
            after which a job is dead-lettered as a poison message.
        idempotency_ttl: seconds an idempotency key's enqueue record and its job's
            completion record live: within it, the same key enqueues nothing new and a
            redelivered copy of a finished keyed job is skipped.
        tracer_provider: an OpenTelemetry tracer provider (default: the global one; with no
            SDK configured, tracing is off and costs next to nothing).
        meter_provider: an OpenTelemetry meter provider (default: the global one).
        trace_link: start each job's ``process`` span in a new trace linked to the
            producer's span instead of as its child.
        trace_detail: ``"job"`` (the default): one ``process`` span per job, its stages
            (receive, lease, handler, settle) recorded as timing attributes on it;
            ``"stages"``: a child span per stage as well (five spans a job, several times
            the cost).
        cache: the ``Cache`` handlers reach as ``ctx.cache``, and where tasks declared with
            ``invalidates=`` invalidate keys when they complete.
        max_payload_bytes: the most bytes a job may take encoded (its whole envelope,
            ``Job.encode()``: payload, headers and metadata), default 1 MiB (1_048_576);
            None: no cap. ``enqueue`` refuses a bigger job with ``aqw.PayloadTooLarge``
            before anything is written, and a worker dead-letters a bigger delivery.
            A task's own ``max_payload_bytes`` overrides it.
        redact_errors: keep payload contents out of error text that outlives the job:
            worker heartbeats (``aqw status``) and span events and statuses show a
            ``ValidationError`` as locations and messages only, without the input values,
            and every message as one capped line. False keeps the raw ``str(error)``.
        keep_for: seconds a finished job's record (``app.job``) and its result live,
            default one day; a task's own ``keep_for`` overrides it.
        partitions: spread the queue over this many Redis streams, each in a hash slot of
            its own, so a Redis Cluster shares one queue's work among its masters
            (``aqw.brokers.redis.PartitionedBroker``; a URL's ``&partitions=P`` says the same).
            A job with a key stays in one partition. None: as the broker says (1).
        outbox: a ``postgresql://`` URL (``?schema=``) or an ``aqw.outbox.Outbox``: where
            ``enqueue(..., conn=)`` writes jobs in the caller's transaction and the relay
            every worker runs reads them (``docs/concepts/outbox.md``).
    """

    def __init__(
        self,
        broker: str | Broker = "memory://",
        *,
        queue: str = "default",
        retry: RetryPolicy | None = None,
        lease_ttl: float = 30.0,
        timeout: float | None = None,
        max_deliveries: int = 10,
        idempotency_ttl: float = 86_400.0,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        trace_link: bool = False,
        trace_detail: Literal["job", "stages"] = "job",
        cache: Cache | None = None,
        max_payload_bytes: int | None = DEFAULT_MAX_PAYLOAD_BYTES,
        redact_errors: bool = True,
        keep_for: float = DEFAULT_KEEP_FOR,
        partitions: int | None = None,
        outbox: str | Outbox | None = None,
    ) -> None:
        check_queue(queue, "App queue")
        if not isinstance(broker, str | Broker):
            raise ConfigError(
                f"App broker must be a URL (memory://, redis://..., sqs://...) or an "
                f"aqw.brokers.Broker, got {quoted(broker)}"
            )
        check_app_options(
            keep_for=keep_for,
            max_payload_bytes=max_payload_bytes,
            redact_errors=redact_errors,
            lease_ttl=lease_ttl,
            timeout=timeout,
            max_deliveries=max_deliveries,
            idempotency_ttl=idempotency_ttl,
            retry=retry,
            trace_link=trace_link,
        )
        if cache is not None and not _is_cache(cache):
            raise ConfigError(f"App cache must be an aqw.Cache, got {quoted(cache)}")
        self.partitions = None if partitions is None else check_partitions(partitions)
        self.broker_url = broker if isinstance(broker, str) else None
        self.broker: Broker = self._broker_of(broker, queue)
        self.queue = self.broker.queue
        self.retry = retry or RetryPolicy()
        self.lease_ttl = lease_ttl
        self.timeout = timeout
        self.max_deliveries = max_deliveries
        self.idempotency_ttl = idempotency_ttl
        self.tasks: dict[str, Task[Any]] = {}
        self.limits = RunTimeLimits(self)  # limits changed at run time: set, show, reset
        self.progress = partial(follow, self)  # ``async for p in app.progress(job_id)``
        self.cache = cache
        self.max_payload_bytes = max_payload_bytes
        self.redact_errors = redact_errors
        self.keep_for = keep_for
        self._telemetry = QueueTelemetry(
            tracer_provider,
            meter_provider,
            link=trace_link,
            detail=trace_detail,
            redact=redact_errors,
        )
        self._brokers: dict[str, Broker] = {}  # other queues' brokers (``broker_for``)
        self.outbox = as_outbox(outbox)

    def use_broker(self, broker: str | Broker, queue: str | None = None) -> None:
        """Point this app at another broker (a URL or a ``Broker``) and, optionally, another
        queue, before any worker runs: what ``aqw --broker/--queue`` does to an app module."""
        self.broker_url = broker if isinstance(broker, str) else None
        self.broker = self._broker_of(broker, queue or self.queue)
        self.queue = self.broker.queue
        self._telemetry.reset()
        self._brokers = {}

    def _broker_of(self, broker: str | Broker, queue: str) -> Broker:
        """The broker a URL names (``queue`` unless it names one) or the one given, spread
        over ``self.partitions`` when set."""
        if isinstance(broker, str):
            return from_url(broker, queue, partitions=self.partitions)
        return with_partitions(broker, self.partitions)

    def lease_ttl_of(self, job: Job | None) -> float:
        """The lease TTL ``job`` runs under: its task's, else the app's (also for None: a
        message that does not decode)."""
        task = self.tasks.get(job.task) if job is not None else None
        return task.options.lease_ttl if task is not None else self.lease_ttl

    def __repr__(self) -> str:
        broker = type(self.broker).__name__
        return f"<App queue={self.queue!r} broker={broker} tasks={len(self.tasks)}>"

    @property
    def telemetry(self) -> Telemetry:
        """Spans and metrics of this app's queue, following the configured providers."""
        return self.telemetry_for(self.queue)

    def telemetry_for(self, queue: str) -> Telemetry:
        """Spans and metrics of ``queue`` (``messaging.destination.name``)."""
        return self._telemetry.of(queue, self.broker_for(queue).system)

    def broker_for(self, queue: str) -> Broker:
        """The broker of ``queue``: this app's own for ``app.queue``, else one built from it
        (a Redis queue on the same connection pool; the in-process or SQS queue of that
        name) once, then kept. A bad name is a ConfigError naming ``queue``."""
        if queue == self.queue:
            return self.broker
        if queue not in self._brokers:
            name = check_queue(queue)
            self._brokers[name] = self.broker.sibling(name)
        return self._brokers[queue]

    # -- registration ----------------------------------------------------------------------

    @overload
    def task(self, fn: Handler[R], /) -> Task[R]: ...

    @overload
    def task(
        self, fn: None = None, /, *, name: str | None = None, **settings: Unpack[TaskSettings]
    ) -> Callable[[Handler[R]], Task[R]]: ...

    def task(
        self,
        fn: Handler[R] | None = None,
        /,
        *,
        name: str | None = None,
        **settings: Unpack[TaskSettings],
    ) -> Task[R] | Callable[[Handler[R]], Task[R]]:
        """Register an ``async def`` handler: ``@app.task`` or ``@app.task(max_retries=5)``.

        Args:
            name: the task's name on the wire (default: the function's ``__qualname__``).
            **settings: the task's options (``max_retries``, ``retry``, ``retry_on``,
                ``lease_ttl``, ``timeout``, ``keep_result``, ``schedule``, ``queue``,
                ``priority``, ``rate_limit``, ``max_per_key``, ``fairness_key``, ...), each
                documented on ``aqw.app.TaskSettings``.
        """

        def register(handler: Handler[R]) -> Task[R]:
            task_name = check_task_name(handler.__qualname__ if name is None else name)
            if task_name in self.tasks:
                raise ConfigError(f"a task named {task_name!r} is already registered")
            task = Task(self, handler, task_name, task_options(self, task_name, settings))
            self.tasks[task_name] = task
            return task

        if fn is not None:
            return register(fn)
        return register

    def get_task(self, name: str) -> Task[Any]:
        """The task registered as ``name``; raises ``aqw.errors.UnknownTask``."""
        try:
            return self.tasks[name]
        except KeyError:
            known = ", ".join(sorted(self.tasks)) or "none"
            raise UnknownTask(f"unknown task {quoted(name)} (registered: {known})") from None

    def payload_limit(self, task_name: str | None) -> int | None:
        """The most bytes an encoded job of ``task_name`` may take (None: no cap): the
        task's ``max_payload_bytes``, or the app's when ``task_name`` is None or unknown."""
        task = self.tasks.get(task_name) if task_name is not None else None
        return task.options.max_payload_bytes if task is not None else self.max_payload_bytes

    # -- producing -------------------------------------------------------------------------

    async def enqueue(
        self,
        task: Task[Any] | str,
        payloads: Sequence[Any],
        *,
        key: str | None = None,
        delay: float | None = None,
        at: datetime | None = None,
        headers: dict[str, str] | None = None,
        expires: float | datetime | None = None,
        debounce: float | None = None,
        debounce_max: float | None = None,
        queue: str | None = None,
        priority: int | None = None,
        fairness_key: str | None = None,
        fairness_weight: float | None = None,
        conn: Any = None,
    ) -> list[Enqueued]:
        """Validate and enqueue jobs of ``task`` (a Task or a task name), one per payload;
        the options are ``Task.enqueue``'s."""
        target = self.get_task(task) if isinstance(task, str) else task
        return await enqueue_jobs(
            self,
            target,
            payloads,
            key=key,
            delay=delay,
            at=at,
            headers=headers,
            expires=expires,
            debounce=debounce,
            debounce_max=debounce_max,
            queue=queue,
            priority=priority,
            fairness_key=fairness_key,
            fairness_weight=fairness_weight,
            conn=conn,
        )

    # -- running ---------------------------------------------------------------------------

    def worker(
        self,
        concurrency: int = 100,
        *,
        prefetch: int = 0,
        grace: float = 30.0,
        burst: bool = False,
        handle_signals: bool = False,
        heartbeat: float = 5.0,
        queues: Sequence[str] | Mapping[str, float] | None = None,
        priority_share: float = DEFAULT_PRIORITY_SHARE,
    ) -> Worker:
        """A worker for this app, used as ``async with app.worker(concurrency=64):``.

        Args:
            concurrency: most jobs running at once.
            prefetch: extra jobs fetched ahead of free slots (0: never hold a job that
                cannot start at once).
            grace: seconds running jobs get to finish on shutdown before they are cancelled
                and handed back for immediate redelivery.
            burst: stop by itself once the queue is empty.
            handle_signals: stop gracefully on SIGINT/SIGTERM.
            heartbeat: seconds between the worker's published summaries (for
                ``aqw status`` and the monitor).
            queues: serve several queues with one pool of slots: a list (strict order: an
                earlier queue's waiting job is always taken first) or ``{name: weight}``
                (fetch shares by weight). Default: the app's queue only.
            priority_share: the lower priority levels' share of fetches, 0 to 1 (default
                0.05): about that fraction of fetches start from the lowest level with jobs
                waiting instead of the highest, so no level starves. 0: strict priority.
        """
        return Worker(
            self,
            concurrency=concurrency,
            prefetch=prefetch,
            grace=grace,
            burst=burst,
            handle_signals=handle_signals,
            heartbeat=heartbeat,
            queues=queues,
            priority_share=priority_share,
        )

    @property
    def dlq(self) -> DeadLetters:
        """The dead-letter queue: list, show, replay and purge dead jobs."""
        return DeadLetters(self)

    @property
    def jobs(self) -> Jobs:
        """The queue's jobs by id: records, results, cancellation."""
        return Jobs(self)

    async def job(self, job_id: str) -> JobInfo | None:
        """The job's whole record (``aqw.JobInfo``), or None: a made-up id, or a record
        past its ``keep_for``."""
        return await Jobs(self).get(job_id)

    job_status = job
    # Batches and flows (app/_batches.py): app.batch, batch_info, batch_results, cancel_batch,
    # start (a flow), flow_info.
    batch, batch_info, batch_results = open_batch, batch_info, batch_results
    cancel_batch, start, flow_info = batch_cancel, start, flow_info_of

    async def result(self, job_id: str, *, timeout: float | None = None) -> Any:
        """The job's result once it has ended, waiting without polling: see
        ``aqw.Jobs.result`` for the errors it raises."""
        return await Jobs(self).result(job_id, timeout)

    async def cancel(self, job_id: str) -> CancelOutcome:
        """Cancel a job: ``"cancelled"``, ``"cancelling"``, ``"finished"`` (a no-op) or
        ``"unknown"``; see ``aqw.Jobs.cancel``."""
        return await Jobs(self).cancel(job_id)

    async def close(self) -> None:
        """Close the brokers' connections."""
        for broker in [*self._brokers.values(), self.broker]:
            await broker.close()


def _is_cache(value: object) -> bool:
    """Whether ``value`` is an ``aqw.Cache`` (its module, and redis-py, loaded only here)."""
    from ..cache import Cache

    return isinstance(value, Cache)
