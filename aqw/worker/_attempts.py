"""What a failed attempt leaves behind: the header that remembers when the job first failed,
its next attempt, and its error as the DLQ, the job's record and the log lines show it."""

from __future__ import annotations

import math
import time

from .._redact import redact_traceback, user_traceback
from ..brokers.base import Failure
from ..job import Job
from ._handler import describe

#: The header a retried job carries: when it first failed (seconds since the epoch).
FIRST_FAILURE = "aqw-first-failure"

#: Longest traceback a log line carries (its last characters: the innermost frames).
LOG_TRACEBACK_CHARS = 4000


def first_failure(job: Job) -> float:
    """When the job first failed (seconds since the epoch), or 0.0: the header is written by
    this worker but travels with the message, so it is read leniently."""
    raw = job.headers.get(FIRST_FAILURE)
    try:
        value = float(raw) if raw else 0.0
    except ValueError:
        return 0.0
    # Past 1e11 s (the year 5138) it is not a time this worker wrote.
    return value if math.isfinite(value) and 0 < value < 1e11 else 0.0


def next_attempt(job: Job) -> Job:
    """The job's next attempt, remembering when it first failed."""
    headers = dict(job.headers)
    if not first_failure(job):
        headers[FIRST_FAILURE] = repr(time.time())
    return job.model_copy(update={"attempt": job.attempt + 1, "headers": headers})


def failure_of(
    job: Job | None,
    error: BaseException,
    worker: str,
    redact: bool,
    payload_error: bool = False,
    fingerprint: str = "",
) -> Failure:
    """The recorded error of a failed attempt (``job`` None: the message did not decode)."""
    return Failure(
        error_type=type(error).__name__,
        error=describe(error, payload_error),
        traceback=traceback_text(error, redact),
        worker=worker,
        first_failed_at=first_failure(job) if job else 0.0,
        failed_at=time.time(),
        fingerprint=fingerprint,
    )


def traceback_text(error: BaseException, redact: bool) -> str:
    """``error``'s traceback as recorded: redacted (payload values left out) unless told
    otherwise, its last 8000 characters."""
    if redact:
        return redact_traceback(error, limit=8000)
    return user_traceback(error)[-8000:]


def log_traceback(error: BaseException, redact: bool) -> str:
    """``error``'s traceback for a log line (its ``exc_text``): redacted as the DLQ's is,
    cut to its last ``LOG_TRACEBACK_CHARS``; empty for an error that was never raised."""
    if error.__traceback__ is None:
        return ""
    text = traceback_text(error, redact).rstrip("\n")
    if len(text) > LOG_TRACEBACK_CHARS:
        text = "... (cut)\n" + text[-LOG_TRACEBACK_CHARS:]
    return text
