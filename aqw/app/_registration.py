"""A task's options as ``@app.task(...)`` takes them, checked and resolved against the app's
defaults into the ``TaskOptions`` the runtime reads."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from ..brokers.multi import check_queue
from ..errors import ConfigError
from ..flow import Adaptive, fairness, flow_control
from ..retry import RetryPolicy, error_classes
from ..schedule import Schedule
from ..task import Invalidates, TaskOptions
from ._arguments import check_task_name, check_task_options, priority_of

if TYPE_CHECKING:  # the cache's module loads redis-py
    from ..cache import Cache


class TaskSettings(TypedDict, total=False):
    """The options of ``App.task`` besides ``name``.

    Attributes:
        max_retries: retries after the first run (overrides the policy's bound).
        retry: this task's ``RetryPolicy`` (default: the app's).
        retry_on: retry only these errors (an exception class or a tuple of them;
            Celery's ``autoretry_for``): any other error dead-letters the job at once.
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
        queue: the queue this task's jobs go to (default: the app's ``queue``); an
            enqueue's ``queue=`` overrides it.
        priority: the level of this task's jobs, an integer 0-9 (default 0; higher runs
            first), unless an enqueue names its own.
        rate_limit: most starts across every worker, ``"100/s"`` (also ``/min``, ``/h``),
            evenly spaced; a job over it waits in the delayed set, no attempt spent.
        rate_key: a function of the payload: one rate bucket per key it returns.
        concurrency_key: a function of the payload; with ``max_per_key`` (an integer >= 1),
            at most that many jobs of one key run at once across every worker.
        max_per_key: see ``concurrency_key``.
        group_key: a function of the validated payload returning the job's message
            group, a string of 1-128 ASCII letters, digits and punctuation (else
            ``enqueue`` raises a ConfigError naming ``group_key``), kept in the job's
            ``aqw-group`` header (an enqueue's own ``headers={"aqw-group": ...}`` wins).
            On SQS it is the ``MessageGroupId``: order per group on FIFO queues,
            fairness per group (fair queues) on standard ones. The Redis and in-process
            brokers carry it but do not order or share by it.
        fairness_key, fairness_weight: a function of the payload or a constant each:
            the job's fair-share key and its weight (``docs/concepts/fairness.md``).
    """

    max_retries: int | None
    retry: RetryPolicy | None
    retry_on: type[BaseException] | tuple[type[BaseException], ...] | None
    lease_ttl: float | None
    timeout: float | None
    sla: float | None
    invalidates: Invalidates | None
    max_payload_bytes: int | None
    keep_result: bool
    keep_for: float | None
    max_result_bytes: int | None
    dead_letter: bool
    schedule: Schedule | None
    queue: str | None
    priority: int | None
    rate_limit: str | Adaptive | None
    rate_key: Callable[[Any], object] | None
    concurrency_key: Callable[[Any], object] | None
    max_per_key: int | None
    group_key: Callable[[Any], object] | None
    fairness_key: Callable[[Any], object] | str | None
    fairness_weight: Callable[[Any], object] | float | None


class AppDefaults(Protocol):
    """The App's defaults that a task's options fall back to."""

    retry: RetryPolicy
    lease_ttl: float
    timeout: float | None
    max_deliveries: int
    cache: Cache | None
    max_payload_bytes: int | None
    keep_for: float


def task_options(app: AppDefaults, task_name: str, settings: TaskSettings) -> TaskOptions:
    """Check ``task_name`` and ``settings`` (a bad value: a ConfigError naming it; an
    unknown option: a TypeError, as for any keyword) and resolve them against ``app``'s
    defaults."""
    check_task_name(task_name)
    for option in settings:
        if option not in TaskSettings.__annotations__:  # what Python says of a bad keyword
            raise TypeError(f"App.task() got an unexpected keyword argument {option!r}")
    s = settings
    invalidates, schedule = s.get("invalidates"), s.get("schedule")
    check_task_options(task_name, s, needs_cache=invalidates is not None and app.cache is None)
    policy = s.get("retry") or app.retry
    max_retries = s.get("max_retries")
    if max_retries is not None:
        policy = policy.with_max_retries(max_retries)
    retry_on = s.get("retry_on")
    if retry_on is not None:
        policy = policy.with_retry_on(error_classes(f"task {task_name!r}: retry_on", retry_on))
    ttl = s.get("lease_ttl")
    ttl = app.lease_ttl if ttl is None else ttl
    limit = s.get("timeout")
    limit = app.timeout if limit is None else limit
    payload_cap, result_cap = s.get("max_payload_bytes"), s.get("max_result_bytes", 1_048_576)
    keep_result, dead_letter, keep_for = (
        s.get("keep_result", False),
        s.get("dead_letter", True),
        s.get("keep_for"),
    )
    queue, group_key = s.get("queue"), s.get("group_key")
    if group_key is not None and not callable(group_key):
        raise ConfigError(f"task {task_name!r}: group_key must be a function of the payload")
    return TaskOptions(
        policy,
        ttl,
        limit,
        s.get("sla"),
        app.max_deliveries,
        invalidates,
        max_payload_bytes=payload_cap if payload_cap is not None else app.max_payload_bytes,
        keep_result=keep_result,
        keep_for=keep_for if keep_for is not None else app.keep_for,
        max_result_bytes=result_cap,
        dead_letter=dead_letter,
        schedule=schedule,
        queue=None if queue is None else check_queue(queue, f"task {task_name!r}: queue"),
        priority=priority_of(s.get("priority"), 0, f"task {task_name!r}"),
        flow=flow_control(
            task_name,
            s.get("rate_limit"),
            s.get("rate_key"),
            s.get("concurrency_key"),
            s.get("max_per_key"),
        ),
        group_key=group_key,
        fairness=fairness(task_name, s.get("fairness_key"), s.get("fairness_weight")),
    )
