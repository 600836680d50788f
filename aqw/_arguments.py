"""Checks and conversions of the App's arguments: caps, durations, run and expiry times.

Every option is checked where it is given (``App(...)``, ``@app.task(...)``, ``enqueue``), so
a bad one is one line naming it, before anything is written or started, never a failure of
every job later. A duration is a finite number of seconds > 0 below 1e9 (``check_seconds``:
nan, an infinity, ``'5'`` and ``True`` are refused), a count an integer, and a value repeated
in a message is cut to 200 characters (``quoted``)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ._text import quoted
from .brokers._debounce import DEBOUNCE_HEADER
from .errors import ConfigError
from .job import MAX_PRIORITY, MIN_PRIORITY
from .retry import RetryPolicy
from .schedule import Schedule


def check_payload_cap(value: object, what: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"{what} must be a positive integer (bytes) or None, got {quoted(value)}")


def check_priority(value: object, what: str) -> None:
    """Refuse a priority that is not an integer level (``bool`` is not one) in range."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not MIN_PRIORITY <= value <= MAX_PRIORITY
    ):
        raise ConfigError(
            f"{what}: priority must be an integer {MIN_PRIORITY}-{MAX_PRIORITY} (higher runs "
            f"first), got {quoted(value)}"
        )


def priority_of(value: object, default: int, what: str) -> int:
    """``value`` as a checked priority level, or ``default`` when it is None."""
    if value is None:
        return default
    check_priority(value, what)
    assert isinstance(value, int)
    return value


#: The longest duration an option takes, in seconds (about 31 years): a finite bound, so
#: that a time in milliseconds still fits the brokers' integers.
MAX_SECONDS = 1e9
#: The longest task name: ``Job.task``'s bound (a job of a longer one could not be written).
MAX_TASK_NAME = 200
#: The longest ``rate_limit`` text looked at (``"100/s"`` needs a handful).
_MAX_RATE_TEXT = 100


def _seconds(value: object) -> bool:
    """True for a finite number of seconds > 0 and below ``MAX_SECONDS`` (not a bool: nan,
    an infinity, ``'5'`` and ``True`` are no durations)."""
    return (
        not isinstance(value, bool) and isinstance(value, int | float) and 0 < value < MAX_SECONDS
    )


def check_seconds(value: object, what: str) -> None:
    """The check of every duration option: a ConfigError naming ``what`` unless ``value``
    is a finite number of seconds > 0 (below 1e9)."""
    if not _seconds(value):
        raise ConfigError(
            f"{what} must be a finite number of seconds > 0 (below 1e9), got {quoted(value)}"
        )


def check_count(value: object, what: str, minimum: int) -> None:
    """A ConfigError naming ``what`` unless ``value`` is an integer >= ``minimum`` (a bool
    or a float such as 1.5 is none)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{what} must be an integer >= {minimum}, got {quoted(value)}")


def check_task_name(name: object) -> str:
    """``name`` when it can name a task: a string of 1-200 printable characters (no NUL,
    newline or other control character: a task name goes into log lines as it is)."""
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_TASK_NAME or not name.isprintable():
        raise ConfigError(
            f"a task name must be a string of 1-{MAX_TASK_NAME} printable characters (no "
            f"control characters such as NUL or a newline), got {quoted(name)}"
        )
    return name


def expires_at_of(expires: float | datetime | None) -> float | None:
    if expires is None:
        return None
    if isinstance(expires, datetime):
        return (expires if expires.tzinfo else expires.replace(tzinfo=UTC)).timestamp()
    if not _seconds(expires):
        raise ConfigError(
            "enqueue: expires must be finite seconds > 0 (below 1e9) or a datetime, got "
            f"{quoted(expires)}"
        )
    return time.time() + float(expires)


def run_at_of(delay: float | None, at: datetime | None) -> float | None:
    """The run time of ``delay`` or ``at`` (checked: ``enqueue_times``), None: now."""
    if delay:
        return time.time() + delay
    if at is not None:
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
        return at.timestamp()
    return None


def check_delay(delay: object) -> None:
    """``enqueue(delay=...)``: a finite number of seconds >= 0, below 1e9 (about 31
    years), refused before anything is written."""
    if (
        isinstance(delay, bool)
        or not isinstance(delay, int | float)
        or not 0 <= delay < MAX_SECONDS
    ):
        raise ConfigError(
            f"enqueue: delay must be a finite number of seconds >= 0 (below 1e9), got "
            f"{quoted(delay)}"
        )


def check_at(at: object) -> None:
    """``enqueue(at=...)``: a ``datetime`` (naive: UTC), less than 1e9 s from now."""
    if not isinstance(at, datetime):
        raise ConfigError(
            f"enqueue: at must be a datetime (timezone-aware, or naive UTC), got "
            f"{quoted(at)} ({type(at).__name__})"
        )
    when = (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()
    if when - time.time() >= MAX_SECONDS:
        raise ConfigError(f"enqueue: at must be less than 1e9 seconds from now, got {at}")


def check_key(key: object) -> None:
    """``enqueue(key=...)``: a string of 1-1000 characters (bytes are refused, not
    decoded: ``key=b"k"`` and ``key="k"`` would otherwise be two keys or one by accident)."""
    if not isinstance(key, str) or not 1 <= len(key) <= 1000:
        raise ConfigError(
            f"enqueue: key must be a non-empty string of at most 1000 chars, got "
            f"{quoted(key, 60)} ({type(key).__name__})"
        )


def check_headers(headers: object) -> None:
    """``enqueue(headers=...)``: a dict of strings to strings."""
    if headers is None:
        return
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise ConfigError(
            f"enqueue: headers must be a dict of strings to strings, got {quoted(headers, 60)}"
        )


def check_task_options(task: str, settings: Mapping[str, Any], needs_cache: bool = False) -> None:
    """Refuse a bad ``@app.task(...)`` option (``settings``: the options given, None for
    one left to the app's default) with one line naming the task and the option."""
    if needs_cache:
        raise ConfigError(
            f"task {task!r}: invalidates= needs a cache: App(..., cache=aqw.Cache(r))"
        )
    check_schedule(task, settings.get("schedule"))
    for option in ("lease_ttl", "timeout", "sla", "keep_for"):
        if settings.get(option) is not None:
            check_seconds(settings[option], f"task {task!r}: {option}")
    check_payload_cap(settings.get("max_payload_bytes"), f"task {task!r}: max_payload_bytes")
    check_payload_cap(settings.get("max_result_bytes"), f"task {task!r}: max_result_bytes")
    for flag in ("keep_result", "dead_letter"):
        value = settings.get(flag, False)
        if not isinstance(value, bool):
            raise ConfigError(f"task {task!r}: {flag} must be True or False, got {quoted(value)}")
    if settings.get("max_retries") is not None:
        check_count(settings["max_retries"], f"task {task!r}: max_retries", 0)
    retry = settings.get("retry")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ConfigError(f"task {task!r}: retry must be an aqw.RetryPolicy, got {quoted(retry)}")
    invalidates = settings.get("invalidates")
    if not (
        invalidates is None
        or callable(invalidates)
        or (isinstance(invalidates, list | tuple) and all(isinstance(k, str) for k in invalidates))
    ):
        raise ConfigError(
            f"task {task!r}: invalidates must be a list of key templates or a function of "
            f"the payload, got {quoted(invalidates)}"
        )
    rate = settings.get("rate_limit")
    if isinstance(rate, str) and len(rate) > _MAX_RATE_TEXT:
        raise ConfigError(
            f"task {task!r}: rate_limit must be '<count>/<s|m|min|h>', got {quoted(rate, 60)}"
        )


def enqueue_times(
    key: str | None,
    delay: float | None,
    at: datetime | None,
    expires: float | datetime | None,
) -> tuple[float | None, float | None]:
    """Check ``enqueue``'s key, delay, at and expires, whatever their types (the caller's
    annotations are not checked at run time); (its run time, its expiry time)."""
    if delay is not None and at is not None:
        raise ConfigError("enqueue: pass either delay= or at=, not both")
    if delay is not None:
        check_delay(delay)
    if at is not None:
        check_at(at)
    if key is not None:
        check_key(key)
    return run_at_of(delay, at), expires_at_of(expires)


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
        raise ConfigError(f"enqueue: debounce must be finite seconds > 0, got {quoted(debounce)}")
    if debounce_max is not None and not (_seconds(debounce_max) and debounce_max >= debounce):
        raise ConfigError(
            f"enqueue: debounce_max must be finite seconds >= debounce ({debounce!r}), "
            f"got {quoted(debounce_max)}"
        )
    if timed:
        raise ConfigError("enqueue: debounce cannot be combined with delay= or at=")
    if count != 1:
        raise ConfigError(f"enqueue: debounce takes exactly one payload, got {count}")
    return {**(headers or {}), DEBOUNCE_HEADER: "1"}


def check_app_options(
    *,
    keep_for: object,
    max_payload_bytes: object,
    redact_errors: object,
    lease_ttl: object,
    timeout: object,
    max_deliveries: object,
    idempotency_ttl: object,
    retry: object,
    trace_link: object,
) -> None:
    """Refuse a bad ``App(...)`` option with one line naming it."""
    check_seconds(keep_for, "App keep_for")
    check_payload_cap(max_payload_bytes, "App max_payload_bytes")
    for name, flag in (("redact_errors", redact_errors), ("trace_link", trace_link)):
        if not isinstance(flag, bool):
            raise ConfigError(f"App {name} must be True or False, got {quoted(flag)}")
    check_seconds(lease_ttl, "App lease_ttl")
    if timeout is not None:
        check_seconds(timeout, "App timeout")
    check_count(max_deliveries, "App max_deliveries", 1)
    check_seconds(idempotency_ttl, "App idempotency_ttl")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ConfigError(f"App retry must be an aqw.RetryPolicy, got {quoted(retry)}")


def check_schedule(task: str, schedule: object) -> None:
    """Refuse a periodic task's bad ``schedule=``: not a ``Cron``/``Every``, an expression
    that does not parse, an interval <= 0, a bad ``catch_up`` or ``skip_if_running``."""
    if schedule is None:
        return
    if not isinstance(schedule, Schedule):
        raise ConfigError(
            f"task {task!r}: schedule must be aqw.Cron(...) or aqw.Every(...), got "
            f"{quoted(schedule)}"
        )
    problem = schedule.problem()
    if problem is not None:
        raise ConfigError(f"task {task!r}: schedule: {problem}")
