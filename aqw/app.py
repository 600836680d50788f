"""The App: a task registry bound to a broker, the producer API and the embedding entry point."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar, overload

from opentelemetry import metrics, trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from ._arguments import (
    check_app_options,
    check_sizes,
    check_task_options,
    enqueue_times,
)
from ._redis.keys import validate_queue_name
from .brokers import Broker, from_url
from .cache import Cache
from .dlq import DeadLetters
from .errors import ConfigError, UnknownTask
from .job import Job
from .jobs import CancelOutcome, Jobs
from .record import DEFAULT_KEEP_FOR, JobInfo
from .retry import RetryPolicy
from .schedule import Schedule
from .task import Enqueued, Handler, Invalidates, Task, TaskOptions
from .telemetry import TRACE_DETAILS, Telemetry
from .worker import Worker

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
    ) -> None:
        validate_queue_name(queue)
        check_app_options(
            keep_for=keep_for,
            max_payload_bytes=max_payload_bytes,
            redact_errors=redact_errors,
            lease_ttl=lease_ttl,
            timeout=timeout,
            max_deliveries=max_deliveries,
            idempotency_ttl=idempotency_ttl,
        )
        self.broker_url = broker if isinstance(broker, str) else None
        self.broker: Broker = from_url(broker, queue) if isinstance(broker, str) else broker
        self.queue = self.broker.queue
        self.retry = retry or RetryPolicy()
        self.lease_ttl = lease_ttl
        self.timeout = timeout
        self.max_deliveries = max_deliveries
        self.idempotency_ttl = idempotency_ttl
        self.tasks: dict[str, Task[Any]] = {}
        self.cache = cache
        self.max_payload_bytes = max_payload_bytes
        self.redact_errors = redact_errors
        self.keep_for = keep_for
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._trace_link = trace_link
        if trace_detail not in TRACE_DETAILS:
            raise ValueError(f"trace_detail must be one of {TRACE_DETAILS}, not {trace_detail!r}")
        self._trace_detail = trace_detail
        self._telemetry: Telemetry | None = None
        self._telemetry_key: tuple[int, int] = (0, 0)

    def use_broker(self, broker: str | Broker, queue: str | None = None) -> None:
        """Point this app at another broker (a URL or a ``Broker``) and, optionally, another
        queue, before any worker runs: what ``aqw --broker/--queue`` does to an app module."""
        if isinstance(broker, str):
            self.broker_url = broker
            self.broker = from_url(broker, queue or self.queue)
        else:
            self.broker_url = None
            self.broker = broker
        self.queue = self.broker.queue
        self._telemetry = None

    def __repr__(self) -> str:
        broker = type(self.broker).__name__
        return f"<App queue={self.queue!r} broker={broker} tasks={len(self.tasks)}>"

    @property
    def telemetry(self) -> Telemetry:
        """Spans and metrics of this app's queue, following the configured providers."""
        tp = self._tracer_provider or trace.get_tracer_provider()
        mp = self._meter_provider or metrics.get_meter_provider()
        key = (id(tp), id(mp))
        if self._telemetry is None or key != self._telemetry_key:
            self._telemetry = Telemetry(
                self.queue,
                self.broker.system,
                tracer_provider=tp,
                meter_provider=mp,
                link=self._trace_link,
                detail=self._trace_detail,
                redact=self.redact_errors,
            )
            self._telemetry_key = key
        return self._telemetry

    # -- registration ----------------------------------------------------------------------

    @overload
    def task(self, fn: Handler[R], /) -> Task[R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        max_retries: int | None = None,
        retry: RetryPolicy | None = None,
        lease_ttl: float | None = None,
        timeout: float | None = None,
        sla: float | None = None,
        invalidates: Invalidates | None = None,
        max_payload_bytes: int | None = None,
        keep_result: bool = False,
        keep_for: float | None = None,
        max_result_bytes: int | None = 1_048_576,
        dead_letter: bool = True,
        schedule: Schedule | None = None,
    ) -> Callable[[Handler[R]], Task[R]]: ...

    def task(
        self,
        fn: Handler[R] | None = None,
        /,
        *,
        name: str | None = None,
        max_retries: int | None = None,
        retry: RetryPolicy | None = None,
        lease_ttl: float | None = None,
        timeout: float | None = None,
        sla: float | None = None,
        invalidates: Invalidates | None = None,
        max_payload_bytes: int | None = None,
        keep_result: bool = False,
        keep_for: float | None = None,
        max_result_bytes: int | None = 1_048_576,
        dead_letter: bool = True,
        schedule: Schedule | None = None,
    ) -> Task[R] | Callable[[Handler[R]], Task[R]]:
        """Register an ``async def`` handler: ``@app.task`` or ``@app.task(max_retries=5)``.

        Args:
            name: the task's name on the wire (default: the function's ``__qualname__``).
            max_retries: retries after the first run (overrides the policy's bound).
            retry: this task's ``RetryPolicy`` (default: the app's).
            lease_ttl: seconds the job's lease lives between renewals.
            timeout: seconds the handler may run before it is cancelled and retried.
            sla: the expected duration in seconds; a job running past 2x is reported stuck.
            invalidates: cache keys to invalidate in the app's ``cache`` when a job of this
                task completes, after the handler's datastore write and before the ack: key
                templates formatted with the payload's fields (``"user:{user_id}"``), or a
                function of the payload returning keys.
            max_payload_bytes: the most bytes a job of this task may take encoded
                (default: the app's ``max_payload_bytes``).
            keep_result: keep the handler's return value as JSON in the job's record, for
                ``app.result`` (validated against the return annotation when it is a
                pydantic model).
            keep_for: seconds a finished job's record and result live (default: the
                app's ``keep_for``).
            max_result_bytes: the most bytes a kept result may take as JSON (default
                1 MiB; None: no cap); a bigger one is not kept and the record says why.
            dead_letter: move a job that fails for good to the dead-letter queue (the
                default); False: it ends ``failed``, in its record only.
            schedule: ``aqw.Cron("*/5 * * * *", tz=...)`` or ``aqw.Every(60)``: the workers
                enqueue one job per tick, with no payload (see ``aqw.schedule``).
        """

        def register(handler: Handler[R]) -> Task[R]:
            task_name = name or handler.__qualname__
            if task_name in self.tasks:
                raise ConfigError(f"a task named {task_name!r} is already registered")
            policy = retry or self.retry
            if max_retries is not None:
                policy = policy.with_max_retries(max_retries)
            ttl = lease_ttl if lease_ttl is not None else self.lease_ttl
            limit = timeout if timeout is not None else self.timeout
            check_task_options(
                task_name,
                lease_ttl=ttl,
                timeout=limit,
                sla=sla,
                max_payload_bytes=max_payload_bytes,
                max_result_bytes=max_result_bytes,
                keep_for=keep_for,
                flags={"keep_result": keep_result, "dead_letter": dead_letter},
                needs_cache=invalidates is not None and self.cache is None,
                schedule=schedule,
            )
            cap = max_payload_bytes if max_payload_bytes is not None else self.max_payload_bytes
            options = TaskOptions(
                policy,
                ttl,
                limit,
                sla,
                self.max_deliveries,
                invalidates,
                max_payload_bytes=cap,
                keep_result=keep_result,
                keep_for=keep_for if keep_for is not None else self.keep_for,
                max_result_bytes=max_result_bytes,
                dead_letter=dead_letter,
                schedule=schedule,
            )
            task = Task(self, handler, task_name, options)
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
            raise UnknownTask(f"unknown task {name!r} (registered: {known})") from None

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
    ) -> list[Enqueued]:
        """Validate and enqueue jobs of ``task`` (a Task or a task name), one per payload.
        ``expires``: seconds from now, or a time, after which a job must not start (it
        then ends ``expired`` without running)."""
        target = self.get_task(task) if isinstance(task, str) else task
        run_at, expires_at = enqueue_times(key, delay, at, expires)
        bodies = [target.validate(p) for p in payloads]  # raises before anything is written
        heads = dict(headers or {})
        jobs = [
            Job(task=target.name, payload=b, key=key, headers=heads, expires_at=expires_at)
            for b in bodies
        ]
        with self.telemetry.publish(jobs):  # measured here: with the trace headers it adds
            check_sizes(target.name, target.options.max_payload_bytes, jobs)
            if key is not None:
                if len(jobs) != 1:
                    raise ConfigError("enqueue: an idempotency key names exactly one job")
                due = run_at if run_at is not None and run_at > time.time() else None
                job_id, duplicate = await self.broker.publish_unique(
                    jobs[0], self.idempotency_ttl, due
                )
                return [Enqueued(job_id, duplicate)]
            if run_at is not None and run_at > time.time():
                await self.broker.schedule(jobs, run_at)
            else:
                await self.broker.publish(jobs)
        return [Enqueued(job.id) for job in jobs]

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
        """
        return Worker(
            self,
            concurrency=concurrency,
            prefetch=prefetch,
            grace=grace,
            burst=burst,
            handle_signals=handle_signals,
            heartbeat=heartbeat,
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

    async def result(self, job_id: str, *, timeout: float | None = None) -> Any:
        """The job's result once it has ended, waiting without polling: see
        ``aqw.jobs.Jobs.result`` for the errors it raises."""
        return await Jobs(self).result(job_id, timeout)

    async def cancel(self, job_id: str) -> CancelOutcome:
        """Cancel a job: ``"cancelled"``, ``"cancelling"``, ``"finished"`` (a no-op) or
        ``"unknown"``; see ``aqw.jobs.Jobs.cancel``."""
        return await Jobs(self).cancel(job_id)

    async def close(self) -> None:
        """Close the broker's connections."""
        await self.broker.close()
