"""A task's options as ``@app.task(...)`` takes them, checked and resolved against the app's
defaults into the ``TaskOptions`` the runtime reads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypedDict

from ..brokers.multi import check_queue
from ..cache import Cache
from ..errors import ConfigError
from ..flow import Adaptive, fairness, flow_control
from ..retry import RetryPolicy, error_classes
from ..schedule import Schedule
from ..task import Invalidates, TaskOptions
from ._arguments import check_task_name, check_task_options, priority_of


class TaskSettings(TypedDict, total=False):
    """The options of ``App.task`` besides ``name``; each is documented there."""

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
