"""Exceptions raised by aqw and understood by its runtime."""

from __future__ import annotations

import math


class AqwError(Exception):
    """Base class of every error aqw raises."""


class ConfigError(AqwError, ValueError):
    """A bad argument or setting, detected before anything is written or started."""


#: The packages of each optional extra, as ``pyproject.toml`` lists them (a test keeps
#: the two in step): what a missing-extra message tells to install.
EXTRAS: dict[str, tuple[str, ...]] = {
    "sqs": ("aioboto3",),
    "otel": ("opentelemetry-sdk", "opentelemetry-exporter-otlp"),
    "postgres": ("asyncpg",),
    "nats": ("nats-py",),
    "fastapi": ("fastapi", "uvicorn"),
    "dashboard": ("starlette", "jinja2", "uvicorn"),
    "uvloop": ("uvloop",),
}


def extra_hint(extra: str) -> str:
    """How to add the optional ``extra`` to the aqw one has, for a missing-extra message:
    aqw is installed from a checkout or a git URL (``pip install 'aqw[sqs]'`` would fetch
    another project from the package index), so the hint names the packages themselves,
    and the extra for a checkout."""
    packages = " ".join(EXTRAS[extra])
    checkout = f"pip install -e '.[{extra}]'"
    return f"pip install {packages} (the {extra} extra; in a checkout of aqw: {checkout})"


class PayloadTooLarge(AqwError, ValueError):
    """A job's encoded envelope is bigger than its task's ``max_payload_bytes``.

    Raised by ``enqueue``/``enqueue_many`` before anything is written; ``task``, ``size``
    (bytes of the encoded job) and ``limit`` (the cap) say which job and by how much.
    """

    def __init__(self, task: str, size: int, limit: int, *, where: str = "") -> None:
        super().__init__(
            f"task {task!r}: the encoded job{where} is {size} bytes, over its "
            f"max_payload_bytes of {limit}"
        )
        self.task = task
        self.size = size
        self.limit = limit


class LeaseLost(AqwError):
    """The lease guarding a block was lost while the block ran.

    Raised out of ``async with lease:`` after the block has been cancelled, because a
    renewal was refused (another holder took the key, or it was deleted) or could not
    succeed before the lease would have expired. Work done under a lost lease must not
    be committed; the job is not acknowledged and will be delivered again.
    """

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"lease {key!r} lost: {reason}")
        self.key = key
        self.reason = reason


class LeaseUnavailable(AqwError):
    """The lease is held by someone else and could not be acquired in time."""

    def __init__(self, key: str, waited: float = 0.0) -> None:
        detail = f" after waiting {waited:.3f}s" if waited >= 0.001 else ""
        super().__init__(f"lease {key!r} is held by another owner{detail}")
        self.key = key
        self.waited = waited


class StaleStart(AqwError):
    """A job's start was refused, taking nothing, writing nothing and handing out no fencing
    token: its delivery is no longer this consumer's (another took it over after a pause,
    and may have run and settled it), or the job has already ended (``ended``: a leftover
    delivery of a finished job, dropped unrun by the start itself). Nothing is to run."""

    def __init__(self, job_id: str, *, ended: bool = False) -> None:
        why = "the job has already ended" if ended else "its delivery is no longer ours"
        super().__init__(f"job {job_id!r} not started: {why}")
        self.job_id = job_id
        self.ended = ended


class FenceCorrupted(AqwError):
    """A fencing counter is damaged (not an integer) or exhausted (at 2^53 - 1, beyond which
    Lua counts inexactly): no lease on it can be taken, and nothing was written.

    aqw never resets the counter itself: fencing tokens must only grow. An operator resumes by
    SETting the key to an integer above every fencing token already handed out (the largest a
    datastore recorded) and below 9007199254740991.
    """

    def __init__(self, key: str, value: str) -> None:
        super().__init__(
            f"fencing counter {key!r} is damaged or exhausted (value {value}): no lease can be "
            f"taken; SET {key} to an integer above every fencing token handed out (and below "
            f"9007199254740991) to resume"
        )
        self.key = key
        self.value = value


class Retry(AqwError):
    """Raised by a handler to ask for the job to run again after ``delay`` seconds.

    The attempt still counts against ``max_retries``.
    """

    def __init__(self, delay: float | None = None, reason: str = "retry requested") -> None:
        if delay is not None and not (math.isfinite(delay) and delay >= 0):
            raise ConfigError(f"Retry(delay=...) must be a finite number >= 0, got {delay!r}")
        super().__init__(reason)
        self.delay = delay
        self.reason = reason


class RateLimited(AqwError):
    """Raised by a handler when an upstream said "too many requests" (an HTTP 429): the job
    waits ``retry_after`` seconds in the delayed set and runs again, without spending an
    attempt (its attempt number and retry budget are unchanged).

    The runtime raises it too, inside the worker, when a task's ``rate_limit`` or
    ``max_per_key`` refuses a job's start; ``reason`` is then ``"rate_limit"`` or
    ``"concurrency"`` (``"handler"`` when a handler raised it).
    """

    def __init__(self, retry_after: float, *, reason: str = "handler") -> None:
        if isinstance(retry_after, bool) or not (
            isinstance(retry_after, int | float) and math.isfinite(retry_after) and retry_after >= 0
        ):
            raise ConfigError(
                f"RateLimited(retry_after=...) must be a finite number >= 0, got {retry_after!r}"
            )
        super().__init__(f"rate limited ({reason}): retry after {retry_after:.3f}s")
        self.retry_after = float(retry_after)
        self.reason = reason


class Reject(AqwError):
    """Raised by a handler to send the job straight to the dead-letter queue."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class JobTimeout(AqwError):
    """The handler ran longer than its task's ``timeout``."""


class MalformedJob(AqwError):
    """A message could not be decoded into a job (bad JSON, missing fields, bad UTF-8)."""


class TooManyDeliveries(AqwError):
    """A message was delivered more times than ``max_deliveries`` without ever being
    settled: its worker crashed or was killed each time (a poison message)."""


class UnknownTask(AqwError):
    """A job names a task that this app does not register."""


class BrokerUnavailable(AqwError):
    """The broker could not be reached."""


class HandlerStopped(BaseException):
    """Thrown into a handler that must stop: its job's lease lapsed or its task's timeout
    passed. The worker turns it into ``LeaseLost`` or ``JobTimeout``; the job is not
    acknowledged.

    It is not a ``CancelledError`` on purpose: on Python 3.11, ``asyncio.wait_for`` (which
    redis-py uses for every send) turns a cancellation that lands as its result is ready into
    that result, and the handler would run on. Like a cancellation, it is a ``BaseException``
    (``except Exception`` does not catch it); clean up in ``finally`` or ``async with``."""


class UnknownJob(AqwError, LookupError):
    """No record of the job: the id was never enqueued here, or its record expired
    (``keep_for`` after it ended)."""

    def __init__(self, job_id: str, queue: str = "") -> None:
        where = f" on queue {queue!r}" if queue else ""
        super().__init__(f"no record of job {job_id!r}{where} (never enqueued, or expired)")
        self.job_id = job_id


class JobFailed(AqwError):
    """``app.result`` of a job that ended in failure: dead-lettered, or failed for good.
    ``info`` is its whole record (``aqw.JobInfo``), ``error`` its last error."""

    def __init__(self, job_id: str, state: str, error: str, info: object = None) -> None:
        super().__init__(f"job {job_id!r} ended {state}: {error}")
        self.job_id = job_id
        self.state = state
        self.error = error
        self.info = info


class JobCancelled(AqwError):
    """The job was cancelled (``app.cancel``): it never ran, or its handler was stopped.

    Raised by ``app.result``; inside the worker it tells the job path that a cancelled job's
    delivery is to be acknowledged without running."""

    def __init__(self, job_id: str, info: object = None) -> None:
        super().__init__(f"job {job_id!r} was cancelled")
        self.job_id = job_id
        self.info = info


class JobExpired(AqwError):
    """The job was not started before its ``expires`` time and never ran."""

    def __init__(self, job_id: str, info: object = None) -> None:
        super().__init__(f"job {job_id!r} expired before it started")
        self.job_id = job_id
        self.info = info


class ResultNotKept(AqwError):
    """The job succeeded but its result could not be kept (too big, or not JSON): the
    message says why. Its work is done; it is not run again."""

    def __init__(self, job_id: str, note: str) -> None:
        super().__init__(f"job {job_id!r} succeeded but its result was not kept: {note}")
        self.job_id = job_id
        self.note = note
