"""Flow control in the job path: the limits a job starts under, and the settle step of a job
put off (``Broker.defer``): a start refused by a rate limit or a per-key cap, or a handler
that raised ``aqw.RateLimited``. (Whether the broker enforces the tasks' limits is checked at
worker start: ``_needs.py``.)

A deferral is normal flow, not a failure: it is logged at DEBUG, counted in the worker's
stats (``deferred``) and in ``aqw.jobs.deferred`` with its ``reason``, and spends no attempt.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any

from ..brokers.base import Broker, Delivery
from ..context import job_fields
from ..errors import RateLimited
from ..flow import per_second, rate_text, stored_rate, with_overrides
from ..job import Job
from ..lease import Lease, LeaseBackend
from ..task import Task
from ..telemetry import ATTR_RETRY_DELAY, JobTrace
from ._settle import Settler

log = logging.getLogger("aqw.worker")


def start_backend(
    broker: Broker, task: Task[Any], job: Job, payload: Any, delivery: Delivery
) -> LeaseBackend:
    """The backend of ``job``'s lease, its start step, which starts ``delivery`` only while it
    is still this consumer's: under its limits (the task's, and the implicit cap of a
    debounced job, ``aqw.flow.debounce_cap``) when the broker enforces them
    (``broker.flow_limits``)."""
    flow = task.options.flow
    if job.key is None and flow.rate is None and flow.concurrency_key is None:
        pass  # no limit of any kind (a debounce cap needs a key): nothing to compute
    elif broker.flow_limits is not None:
        limits = flow.limits(task.name, payload, job)
        if limits:
            run = broker.run_limits  # limits changed at run time (``aqw limits set``)
            changed = run.current() if run is not None else None
            if changed:
                limits = with_overrides(limits, task.name, changed)
            return broker.job_lease_backend(job, limits, delivery)
    return broker.job_lease_backend(job, None, delivery)


def has_cap(task: Task[Any]) -> bool:
    """Whether ``task`` has a per-key cap (``concurrency_key`` with ``max_per_key``)."""
    flow = task.options.flow
    return flow.concurrency_key is not None and flow.max_per_key is not None


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
    settler.window.count("deferred", job.task)
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


#: An adaptive rate limit (``aqw.Adaptive``): what a handler's ``RateLimited`` multiplies
#: it by, the part of its registered rate a second of successes adds back, and the least
#: time between two changes by one worker.
DECREASE = 0.5
INCREASE = 0.05
CHANGE_EVERY = 1.0


class AdaptiveRates:
    """A worker's changes of its tasks' adaptive rate limits, stored with the queue (the
    broker's ``run_limits``): lowered on an upstream's 429, grown back on successes."""

    def __init__(self) -> None:
        self._changed: dict[str, float] = {}

    def _now(self, task: str) -> float | None:
        """The time, when ``task``'s limit may change now (one change a second)."""
        now = time.monotonic()
        if now - self._changed.get(task, -CHANGE_EVERY) < CHANGE_EVERY:
            return None
        return now

    async def lower(self, broker: Broker, task: Task[Any]) -> None:
        await self._change(broker, task, lambda now, top: now * DECREASE)

    async def grow(self, broker: Broker, task: Task[Any]) -> None:
        await self._change(broker, task, lambda now, top: now + top * INCREASE)

    async def _change(self, broker: Broker, task: Task[Any], step: Any) -> None:
        flow, store = task.options.flow, broker.run_limits
        if flow.rate is None or flow.floor is None or store is None:
            return
        stamp = self._now(task.name)
        if stamp is None:
            return
        top, low = per_second(flow.rate), per_second(flow.floor)
        current = stored_rate(store.current().get(f"rate:{task.name}"))
        now = per_second(current) if current is not None else top
        new = min(top, max(low, step(now, top)))
        if rate_text(new) == rate_text(now):
            return
        self._changed[task.name] = stamp
        try:
            await store.write(f"rate:{task.name}", rate_text(new))
            await store.refresh()
        except broker.transient_errors as exc:  # the next 429 or success tries again
            log.warning("task %s: could not change its adaptive rate limit: %s", task.name, exc)
