"""The worker's log lines that a log pipeline keys on (logger ``aqw.worker``).

Every line about a finished attempt carries, besides the job's ``job_id``, ``task`` and
``attempt``, its ``outcome`` (``succeeded``, ``failed``, ``retrying``, ``dead``,
``cancelled`` or ``expired``) and ``duration_ms`` (the handler's run; 0 for a job that
never ran), and, when it failed, ``error_type``. A failed attempt's traceback (redacted
and bounded: ``_attempts.log_traceback``) is the record's ``exc_text``: every ``logging``
formatter prints it under the message, and a JSON formatter makes it the ``exc_info``
field, so the ``message`` stays one line. The fields are built only for a line that is
emitted: the success line of every job costs no dict when INFO is off.

The start line names the broker (``Broker.describe``: host, database and queue, never a
password), so a worker on the wrong database shows it; the stop line says the counters once,
for people (``WorkerStats.summary``), and carries them as ``stats`` for a pipeline.
"""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Iterable
from typing import Any

from ..brokers.base import Broker
from ..errors import Retry
from ..job import Job
from ._attempts import log_traceback
from ._handler import describe
from ._running import WorkerStats

log = logging.getLogger("aqw.worker")

#: The values of the ``outcome`` field of a finished attempt's line.
SUCCEEDED, FAILED, RETRYING, DEAD, CANCELLED, EXPIRED = (
    "succeeded",
    "failed",
    "retrying",
    "dead",
    "cancelled",
    "expired",
)


def attempt_fields(
    job: Job, outcome: str, duration: float, error: BaseException | None = None
) -> dict[str, Any]:
    """The ``extra`` fields of a finished attempt's line (``duration`` in seconds)."""
    fields = {
        "job_id": job.id,
        "task": job.task,
        "attempt": job.attempt,
        "outcome": outcome,
        "duration_ms": round(duration * 1000, 3),
    }
    if error is not None:
        fields["error_type"] = type(error).__name__
    return fields


def log_attempt(
    level: int,
    msg: str,
    args: tuple[Any, ...],
    fields: dict[str, Any] | None,
    error: BaseException | None = None,
    redact: bool = True,
) -> None:
    """Log ``msg % args`` at ``level`` with ``fields``, and ``error``'s traceback (redacted
    unless told otherwise: ``log_traceback``) as the record's ``exc_text``: under the
    message in a text line, ``exc_info`` in JSON. Nothing is built when the level is off."""
    if not log.isEnabledFor(level):
        return
    fn, line, func, _ = log.findCaller(False, 3)  # the caller of the log_* function
    record = log.makeRecord(log.name, level, fn, line, msg, args, None, func, fields)
    traceback = log_traceback(error, redact) if error is not None else ""
    if traceback:
        record.exc_text = traceback
    log.handle(record)


def log_retrying(job: Job, error: BaseException, delay: float, ran: float, redact: bool) -> None:
    """A failed attempt that will be retried: WARNING, with its traceback (none for a
    requested ``aqw.Retry``)."""
    log_attempt(
        logging.WARNING,
        "job %s (%s) attempt %d failed: %s; retrying in %.2fs",
        (job.id, job.task, job.attempt, describe(error), delay),
        attempt_fields(job, RETRYING, ran, error),
        None if isinstance(error, Retry) else error,
        redact,
    )


def log_failed(job: Job, reason: str, error: BaseException, ran: float, redact: bool) -> None:
    """The last attempt of a task that keeps no dead letters failed: ERROR."""
    log_attempt(
        logging.ERROR,
        "job %s (%s) attempt %d failed for good (its task keeps no dead letters): %s",
        (job.id, job.task, job.attempt, reason),
        attempt_fields(job, FAILED, ran, error),
        error,
        redact,
    )


def log_dead(
    message: str,
    job: Job | None,
    reason: str,
    entry: str,
    show: str,
    error: BaseException,
    ran: float,
    redact: bool,
) -> None:
    """A job (or a ``message`` that is none) dead-lettered as DLQ ``entry``: ERROR, with
    the command that shows the entry (``show``) and the traceback."""
    if job is None:
        fields = {"dlq_entry": entry, "outcome": DEAD, "error_type": type(error).__name__}
        log_attempt(
            logging.ERROR,
            "message %s (undecodable) dead-lettered: %s; DLQ entry %s (%s)",
            (message, reason, entry, show),
            fields,
        )
        return
    fields = attempt_fields(job, DEAD, ran, error)
    fields["dlq_entry"] = entry
    log_attempt(
        logging.ERROR,
        "job %s (%s) attempt %d dead-lettered: %s; DLQ entry %s (%s)",
        (job.id, job.task, job.attempt, reason, entry, show),
        fields,
        error,
        redact,
    )


def log_crashed(
    message: str, job: Job | None, error: BaseException, retrying: bool, redact: bool
) -> None:
    """The job path itself failed: ERROR; when the job is retried this is its attempt's
    line (with the traceback), else the dead-letter line that follows is."""
    fields: dict[str, Any] | None = None
    if job is not None:
        fields = {"job_id": job.id, "task": job.task, "attempt": job.attempt}
        if retrying:
            fields.update(outcome=RETRYING, error_type=type(error).__name__, duration_ms=0.0)
    log_attempt(
        logging.ERROR,
        "job path failed for message %s: %s",
        (message, describe(error)),
        fields,
        error if retrying else None,
        redact,
    )


def log_started(
    worker: str, broker: Broker, queues: Iterable[str], concurrency: int, tasks: Iterable[str]
) -> None:
    """The worker's start line: where it consumes, how many jobs at once, which tasks."""
    where = broker.describe()
    log.info(
        "worker %s started on %s: concurrency=%d tasks=%s",
        worker,
        where,
        concurrency,
        ", ".join(sorted(tasks)),
        extra={"broker": where, "queues": list(queues)},
        stacklevel=2,
    )


def log_stopped(worker: str, seconds: float, stats: WorkerStats) -> None:
    """The worker's stop line: how long it ran and what it did, once."""
    log.info(
        "worker %s stopped after %.1fs: %s",
        worker,
        seconds,
        stats.summary(),
        extra={"stats": stats.as_dict()},
        stacklevel=2,
    )


class Hints:
    """The options a pasted command needs to find a worker's app, for the copy-paste hints
    of its log lines (``aqw dlq show ENTRY --app jobs:app``): ``target`` as ``aqw worker``
    set it from its own options, else the module attribute that holds the app, looked up
    among the loaded modules the first time a hint is written (``""`` when none does)."""

    def __init__(self, app: object) -> None:
        self.app = app
        self.target: str | None = None

    def command(self, words: str) -> str:
        """``aqw WORDS`` and the target options."""
        if self.target is None:
            self.target = "" if self.app is None else app_target(self.app)
        return f"aqw {words}{self.target}"


def app_target(app: object) -> str:
    """`` --app module:name`` for the first loaded module (but ``__main__``, which another
    process would not import) with a global holding ``app``; ``""`` when none has."""
    for name, module in list(sys.modules.items()):
        if name == "__main__" or not isinstance(module, types.ModuleType):
            continue
        for attr, value in list(getattr(module, "__dict__", {}).items()):
            if value is app and not attr.startswith("_"):
                return f" --app {name}:{attr}"
    return ""
