"""The packed arguments of the Redis job scripts (``_jobs.py``, ``_settle.py``, ``_job_start.py``,
``_debounce.py``): milliseconds, flattened record fields, and each job's part of
``enqueue.lua``'s and ``ack.lua``'s ARGV (described at the top of each script)."""

from __future__ import annotations

from typing import Any

from ..._redis.scripts import ms
from ...job import Job
from ...record import UNFINISHED_KEEP, stamp


def ack_values(idem: str, values: list[str]) -> tuple[str, ...]:
    """The values after a job's head in ``ack.lua``'s ARGV: the idempotency key and the
    record's field/value pairs (none at all for most jobs)."""
    if not idem and not values:
        return ()
    return (idem, *values)


def flat(fields: dict[str, str]) -> list[str]:
    return [x for pair in fields.items() for x in pair]


def enqueue_head(
    prefix: str, keep: float, due: float | None, later: bool, job: Job
) -> tuple[Any, ...]:
    """The shared part of ``enqueue.lua``'s ARGV for jobs like ``job``."""
    return (
        prefix,
        ms(keep),
        int(due * 1000) if due is not None and later else 0,
        stamp(due) if later else "",
        stamp(job.expires_at),
        job.key or "",
    )


def enqueue_args(job: Job, due: float | None, now: float) -> list[Any]:
    """A job's part of ``enqueue.lua``'s ARGV (and ``enqueue_unique.lua``'s tail): its data,
    its due time in ms (0: now), then its record's run_at, task, attempts, enqueued_at,
    expires_at, key and TTL."""
    later = due is not None and due > now
    keep = UNFINISHED_KEEP + (due - now if due is not None and later else 0.0)
    return [
        job.encode(),
        int(due * 1000) if due is not None else 0,
        stamp(due) if later else "",
        job.task,
        job.attempt - 1,
        repr(job.enqueued_at),
        stamp(job.expires_at),
        job.key or "",
        ms(keep),
    ]
