"""Checks and conversions of the App's arguments: caps, durations, run and expiry times."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime

from ..errors import ConfigError, PayloadTooLarge
from ..flow import DEBOUNCE_HEADER
from ..job import MAX_PRIORITY, MIN_PRIORITY, Job
from ..schedule import Schedule


def check_payload_cap(value: object, what: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"{what} must be a positive integer (bytes) or None, got {value!r}")


def check_priority(value: object, what: str) -> None:
    """Refuse a priority that is not an integer level (``bool`` is not one) in range."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not MIN_PRIORITY <= value <= MAX_PRIORITY
    ):
        raise ConfigError(
            f"{what}: priority must be an integer {MIN_PRIORITY}-{MAX_PRIORITY} (higher runs "
            f"first), got {value!r}"
        )


def priority_of(value: object, default: int, what: str) -> int:
    """``value`` as a checked priority level, or ``default`` when it is None."""
    if value is None:
        return default
    check_priority(value, what)
    assert isinstance(value, int)
    return value


def check_seconds(value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
        raise ConfigError(f"{what} must be a number of seconds > 0, got {value!r}")


def expires_at_of(expires: float | datetime | None) -> float | None:
    if expires is None:
        return None
    if isinstance(expires, datetime):
        return (expires if expires.tzinfo else expires.replace(tzinfo=UTC)).timestamp()
    if isinstance(expires, bool) or not isinstance(expires, int | float) or not 0 < expires < 1e9:
        raise ConfigError(f"enqueue: expires must be seconds > 0 or a datetime, got {expires!r}")
    return time.time() + expires


def check_sizes(task: str, limit: int | None, jobs: Sequence[Job]) -> None:
    """Refuse the whole batch when one encoded job is over ``limit`` (nothing is written)."""
    if limit is None:
        return
    for i, job in enumerate(jobs):
        size = len(job.encode())
        if size > limit:
            where = f" (payload {i + 1} of {len(jobs)})" if len(jobs) > 1 else ""
            raise PayloadTooLarge(task, size, limit, where=where)


def run_at_of(delay: float | None, at: datetime | None) -> float | None:
    if delay:
        return time.time() + delay
    if at is not None:
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
        return at.timestamp()
    return None


def check_task_options(
    task: str,
    *,
    lease_ttl: float,
    timeout: float | None,
    sla: float | None,
    max_payload_bytes: int | None,
    max_result_bytes: int | None,
    keep_for: float | None,
    flags: dict[str, object],
    needs_cache: bool = False,
    schedule: object = None,
) -> None:
    """Refuse a bad ``@app.task(...)`` option with a message naming the task and option."""
    if needs_cache:
        raise ConfigError(
            f"task {task!r}: invalidates= needs a cache: App(..., cache=aqw.Cache(r))"
        )
    check_schedule(task, schedule)
    if lease_ttl <= 0:
        raise ConfigError(f"task {task!r}: lease_ttl must be > 0, got {lease_ttl!r}")
    if timeout is not None and timeout <= 0:
        raise ConfigError(f"task {task!r}: timeout must be > 0, got {timeout!r}")
    if sla is not None and sla <= 0:
        raise ConfigError(f"task {task!r}: sla must be > 0, got {sla!r}")
    check_payload_cap(max_payload_bytes, f"task {task!r}: max_payload_bytes")
    check_payload_cap(max_result_bytes, f"task {task!r}: max_result_bytes")
    if keep_for is not None:
        check_seconds(keep_for, f"task {task!r}: keep_for")
    for flag, value in flags.items():
        if not isinstance(value, bool):
            raise ConfigError(f"task {task!r}: {flag} must be True or False, got {value!r}")


def enqueue_times(
    key: str | None,
    delay: float | None,
    at: datetime | None,
    expires: float | datetime | None,
) -> tuple[float | None, float | None]:
    """Check ``enqueue``'s key, delay, at and expires; (its run time, its expiry time)."""
    if delay is not None and at is not None:
        raise ConfigError("enqueue: pass either delay= or at=, not both")
    if delay is not None and delay < 0:
        raise ConfigError(f"enqueue: delay must be >= 0 seconds, got {delay!r}")
    if key is not None and (not key or len(key) > 1000):
        raise ConfigError("enqueue: key must be a non-empty string of at most 1000 chars")
    return run_at_of(delay, at), expires_at_of(expires)


def _seconds(value: object) -> bool:
    """True for a finite number of seconds > 0 (not a bool)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and 0 < value < 1e9


def debounce_headers(
    headers: dict[str, str] | None,
    key: str | None,
    timed: bool,
    count: int,
    debounce: float | None,
    debounce_max: float | None,
) -> dict[str, str]:
    """Check ``enqueue``'s ``debounce`` and ``debounce_max`` (``timed``: a ``delay`` or ``at``
    was given; ``count``: payloads); the job's headers, marked when it is debounced."""
    if debounce is None:
        if debounce_max is not None:
            raise ConfigError("enqueue: debounce_max needs debounce= (seconds) as well")
        return dict(headers or {})
    if key is None:
        raise ConfigError("enqueue: debounce needs key= (the key whose burst runs once)")
    if not _seconds(debounce):
        raise ConfigError(f"enqueue: debounce must be finite seconds > 0, got {debounce!r}")
    if debounce_max is not None and not (_seconds(debounce_max) and debounce_max >= debounce):
        raise ConfigError(
            f"enqueue: debounce_max must be finite seconds >= debounce ({debounce!r}), "
            f"got {debounce_max!r}"
        )
    if timed:
        raise ConfigError("enqueue: debounce cannot be combined with delay= or at=")
    if count != 1:
        raise ConfigError(f"enqueue: debounce takes exactly one payload, got {count}")
    return {**(headers or {}), DEBOUNCE_HEADER: "1"}


def check_app_options(
    *,
    keep_for: float,
    max_payload_bytes: int | None,
    redact_errors: object,
    lease_ttl: float,
    timeout: float | None,
    max_deliveries: int,
    idempotency_ttl: float,
) -> None:
    """Refuse a bad ``App(...)`` option with a message naming it."""
    check_seconds(keep_for, "App keep_for")
    check_payload_cap(max_payload_bytes, "App max_payload_bytes")
    if not isinstance(redact_errors, bool):
        raise ConfigError(f"App redact_errors must be True or False, got {redact_errors!r}")
    if lease_ttl <= 0:
        raise ConfigError(f"App lease_ttl must be > 0 seconds, got {lease_ttl!r}")
    if timeout is not None and timeout <= 0:
        raise ConfigError(f"App timeout must be > 0 seconds or None, got {timeout!r}")
    if max_deliveries < 1:
        raise ConfigError(f"App max_deliveries must be >= 1, got {max_deliveries!r}")
    if idempotency_ttl <= 0:
        raise ConfigError(f"App idempotency_ttl must be > 0 seconds, got {idempotency_ttl!r}")


def check_schedule(task: str, schedule: object) -> None:
    """Refuse a periodic task's bad ``schedule=``: not a ``Cron``/``Every``, an expression
    that does not parse, an interval <= 0, a bad ``catch_up`` or ``skip_if_running``."""
    if schedule is None:
        return
    if not isinstance(schedule, Schedule):
        raise ConfigError(
            f"task {task!r}: schedule must be aqw.Cron(...) or aqw.Every(...), got {schedule!r}"
        )
    problem = schedule.problem()
    if problem is not None:
        raise ConfigError(f"task {task!r}: schedule: {problem}")
