"""A job's record: its state and story from enqueue to its end, as brokers store it (a flat
map of strings, e.g. the Redis hash ``aqw:{q}:job:<id>``) and as users read it (``JobInfo``).

States:

============  ==============================================================================
queued        waiting in the queue (a delayed job whose time has come reads as queued too)
delayed       waiting for its ``run_at`` time
running       a worker holds its lease and runs its handler
retrying      an attempt failed; the next one waits for its ``run_at`` time
succeeded     the handler returned and the job was acknowledged
failed        the last attempt failed and the task keeps no dead letters (``dead_letter=False``)
dead          moved to the dead-letter queue (``dlq_entry`` names the entry)
cancelled     ``app.cancel`` stopped it: it never ran, or its handler was stopped
expired       not started before its ``expires`` time: it never ran
============  ==============================================================================

The last five are final. A record lives ``keep_for`` seconds after its job ends (default one
day) and ``UNFINISHED_KEEP`` past its due time while the job has not ended.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, get_args

from pydantic import BaseModel, ConfigDict

JobState = Literal[
    "queued",
    "delayed",
    "running",
    "retrying",
    "succeeded",
    "failed",
    "dead",
    "cancelled",
    "expired",
]

STATES: tuple[str, ...] = get_args(JobState)
FINAL_STATES = frozenset({"succeeded", "failed", "dead", "cancelled", "expired"})

#: Seconds a finished job's record lives, unless the app or the task says otherwise.
DEFAULT_KEEP_FOR = 86_400.0

#: Seconds an unfinished job's record lives past its due time (refreshed whenever the job
#: changes state): long enough for any backlog, bounded so a job lost with its queue (a
#: deleted stream) does not leave its record for ever.
UNFINISHED_KEEP = 7 * 86_400.0

#: Fields of the stored record, in the order ``JobInfo.fields`` writes them.
FIELDS = (
    "state",
    "task",
    "attempts",
    "enqueued_at",
    "started_at",
    "finished_at",
    "run_at",
    "expires_at",
    "worker",
    "progress",
    "message",
    "key",
    "result",
    "result_note",
    "error_type",
    "error",
    "fingerprint",
    "traceback",
    "dlq_entry",
    "lease_expires_at",
    "fencing_token",
    "cancel",
)


class JobError(BaseModel):
    """The last error of a job."""

    model_config = ConfigDict(frozen=True)

    type: str
    message: str
    fingerprint: str = ""
    traceback: str = ""


class JobInfo(BaseModel):
    """Everything known about one job (``await app.job(job_id)``).

    Times are timezone-aware UTC datetimes. ``attempts`` is the attempt number of the
    latest run (1 for the first run, 2 for the first retry; a job run again after its
    worker crashed keeps its attempt number), 0 before it first ran.
    ``result`` is the handler's return value as JSON data when the task keeps results
    (``has_result``); ``result_note`` says why a result was not kept (too big, not JSON).
    ``damaged`` lists stored fields that could not be read (they got defaults).
    """

    model_config = ConfigDict(frozen=True)

    id: str
    queue: str
    state: JobState
    task: str = ""
    attempts: int = 0
    enqueued_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    run_at: datetime | None = None
    expires_at: datetime | None = None
    worker: str = ""
    progress: float = 0.0
    message: str = ""
    key: str | None = None
    has_result: bool = False
    result: Any = None
    result_note: str = ""
    error: JobError | None = None
    dlq_entry: str | None = None
    lease_expires_at: datetime | None = None
    fencing_token: int = 0
    cancel_requested: bool = False
    damaged: tuple[str, ...] = ()

    @property
    def finished(self) -> bool:
        """True once the job has ended (succeeded, failed, dead, cancelled or expired)."""
        return self.state in FINAL_STATES

    @classmethod
    def from_fields(cls, job_id: str, queue: str, fields: Mapping[str, str]) -> JobInfo:
        """Read a stored record leniently: a field that does not parse gets its default
        and is named in ``damaged``."""
        damaged: list[str] = []

        def when(name: str) -> datetime | None:
            raw = fields.get(name, "")
            if not raw:
                return None
            try:
                value = float(raw)
                if not math.isfinite(value) or not 0 <= value < 1e11:
                    raise ValueError(raw)
                return datetime.fromtimestamp(value, UTC)
            except (ValueError, OverflowError):
                damaged.append(name)
                return None

        def number(name: str, kind: type[int] | type[float]) -> Any:
            raw = fields.get(name, "")
            if not raw:
                return kind(0)
            try:
                value = kind(float(raw)) if kind is float else int(raw)
                if kind is float and not math.isfinite(value):
                    raise ValueError(raw)
                return value
            except (ValueError, OverflowError):
                damaged.append(name)
                return kind(0)

        state = fields.get("state", "")
        if state not in STATES:
            damaged.append("state")
            state = "queued"
        run_at = when("run_at")
        if state == "delayed" and run_at is not None and run_at.timestamp() <= time.time():
            state = "queued"  # its time came: it waits in the queue now
        result: Any = None
        has_result = "result" in fields
        if has_result:
            try:
                result = json.loads(fields["result"])
            except ValueError:
                damaged.append("result")
                has_result = False
        error = None
        if fields.get("error_type"):
            error = JobError(
                type=fields["error_type"],
                message=fields.get("error", ""),
                fingerprint=fields.get("fingerprint", ""),
                traceback=fields.get("traceback", ""),
            )
        return cls(
            id=job_id,
            queue=queue,
            state=state,  # type: ignore[arg-type]
            task=fields.get("task", ""),
            attempts=number("attempts", int),
            enqueued_at=when("enqueued_at"),
            started_at=when("started_at"),
            finished_at=when("finished_at"),
            run_at=run_at,
            expires_at=when("expires_at"),
            worker=fields.get("worker", ""),
            progress=number("progress", float),
            message=fields.get("message", ""),
            key=fields.get("key") or None,
            has_result=has_result,
            result=result,
            result_note=fields.get("result_note", ""),
            error=error,
            dlq_entry=fields.get("dlq_entry") or None,
            lease_expires_at=when("lease_expires_at"),
            fencing_token=number("fencing_token", int),
            cancel_requested=fields.get("cancel", "") == "1",
            damaged=tuple(damaged),
        )


def stamp(seconds: float | None) -> str:
    """A time as a record field: seconds since the epoch, or '' for none."""
    return "" if seconds is None else repr(float(seconds))


class Enqueued(Protocol):
    """What a job's first record is made of (``aqw.job.Job`` has it)."""

    @property
    def task(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def enqueued_at(self) -> float: ...
    @property
    def expires_at(self) -> float | None: ...
    @property
    def key(self) -> str | None: ...


def queued_fields(job: Enqueued, due: float | None) -> dict[str, str]:
    """The record of ``job`` as its enqueue writes it, on every broker (``due``: its run
    time when delayed)."""
    return {
        "state": "delayed" if due is not None else "queued",
        "task": job.task,
        "attempts": str(job.attempt - 1),
        "enqueued_at": repr(job.enqueued_at),
        "run_at": stamp(due),
        "expires_at": stamp(job.expires_at),
        "key": job.key or "",
    }
