"""Flow control in the job path: the limits a job starts under, the check that the broker can
enforce the tasks' limits, and the settle step of a job put off (``Broker.defer``): a start
refused by a rate limit or a per-key cap, or a handler that raised ``aqw.RateLimited``.

A deferral is normal flow, not a failure: it is logged at DEBUG, counted in the worker's
stats (``deferred``) and in ``aqw.jobs.deferred`` with its ``reason``, and spends no attempt.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from functools import partial
from typing import Any

from ..brokers.base import Broker, Delivery
from ..context import job_fields
from ..errors import ConfigError, RateLimited
from ..job import Job
from ..lease import Lease, LeaseBackend
from ..task import Task
from ..telemetry import ATTR_RETRY_DELAY, JobTrace
from ._settle import Settler

log = logging.getLogger("aqw.worker")


def check_limits(broker: Broker, tasks: Mapping[str, Task[Any]]) -> None:
    """Refuse, at worker start, a task whose rate limit or per-key cap ``broker`` cannot
    enforce across workers (SQS: no shared store for them)."""
    if broker.enforces_limits:
        return
    for name, task in tasks.items():
        for option in task.options.flow.options:
            raise ConfigError(
                f"task {name!r}: {option} needs a broker that enforces it across workers "
                f"(redis:// or memory://); the {type(broker).__name__} broker does not"
            )


def start_backend(
    broker: Broker, task: Task[Any], job: Job, payload: Any, delivery: Delivery
) -> LeaseBackend:
    """The backend of ``job``'s lease, which starts ``delivery`` only while it is still this
    consumer's: under its limits (the task's, and the implicit cap of a debounced job,
    ``_flow.debounce_cap``) when the broker enforces them."""
    if broker.enforces_limits:
        limits = task.options.flow.limits(task.name, payload, job)
        if limits:
            return broker.limited_lease_backend(job, limits, delivery)
    return broker.job_lease_backend(job, delivery)


async def defer(
    settler: Settler,
    delivery: Delivery,
    job: Job,
    lease: Lease | None,
    limited: RateLimited,
    jt: JobTrace,
) -> None:
    """Put the job off for ``limited.retry_after`` seconds (``lease``: the lease its handler
    ran under, None for a refused start), the same attempt."""
    run_at = time.time() + limited.retry_after
    step = partial(settler.broker.defer, delivery, job, run_at, lease)
    if not await settler.step(step):
        settler.lost(job, " (not put off)")
        return
    jt.settled("defer", {ATTR_RETRY_DELAY: limited.retry_after})
    settler.stats.deferred += 1
    settler.window.count("deferred")
    settler.tel.count_reason("aqw.jobs.deferred", job.task, limited.reason)
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "job %s (%s) attempt %d put off %.3fs (%s)",
            job.id,
            job.task,
            job.attempt,
            limited.retry_after,
            limited.reason,
            extra=job_fields(job),
        )
