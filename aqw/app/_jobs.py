"""A job's life as an API: read its record, wait for its result, cancel it."""

from __future__ import annotations

import math
from typing import Any, Protocol

from .._text import quoted
from ..brokers import Broker, CancelOutcome
from ..errors import ConfigError, JobCancelled, JobExpired, JobFailed, ResultNotKept
from ..record import DEFAULT_KEEP_FOR, JobInfo
from ..task import Task

__all__ = ["CancelOutcome", "Jobs", "JobsApp"]


class JobsApp(Protocol):
    """What the job API needs of the App: its broker, its tasks and its record lifetime."""

    @property
    def broker(self) -> Broker: ...
    @property
    def tasks(self) -> dict[str, Task[Any]]: ...
    @property
    def keep_for(self) -> float: ...


class Jobs:
    """The jobs of an app's queue by id (``app.job``, ``app.result``, ``app.cancel``)."""

    def __init__(self, app: JobsApp) -> None:
        self.app = app
        self.broker = app.broker

    async def get(self, job_id: str) -> JobInfo | None:
        """The job's whole record, or None when there is none (never enqueued here, or its
        record expired ``keep_for`` after it ended)."""
        _check_id(job_id)
        return await self.broker.records.record(job_id)

    async def wait(self, job_id: str, timeout: float | None = None) -> JobInfo:
        """The job's record once it has ended; see ``result``."""
        _check_id(job_id)
        _check_timeout(timeout)
        return await self.broker.records.wait_finished(job_id, timeout)

    async def result(self, job_id: str, timeout: float | None = None) -> Any:
        """The job's result once it has ended, waiting up to ``timeout`` seconds (None: no
        limit) without polling.

        Returns the handler's return value (a model instance when the handler's return
        annotation is a pydantic model), or None when the task does not keep results.
        Raises ``aqw.JobFailed`` (dead-lettered, or failed for good), ``aqw.JobCancelled``,
        ``aqw.JobExpired``, ``aqw.ResultNotKept`` (it succeeded but its result was too big
        or not JSON), ``aqw.UnknownJob`` (no record of it) and ``TimeoutError``."""
        info = await self.wait(job_id, timeout)
        return self.outcome(info)

    def outcome(self, info: JobInfo) -> Any:
        """The result of a finished job's record, or the error it ended with."""
        if info.state == "succeeded":
            if info.result_note and not info.has_result:
                raise ResultNotKept(info.id, info.result_note)
            task = self.app.tasks.get(info.task)
            if task is None or not info.has_result:
                return info.result
            return task.results.load(info.result)
        if info.state in ("dead", "failed"):
            error = info.error
            text = f"{error.type}: {error.message}" if error is not None else "no error recorded"
            raise JobFailed(info.id, info.state, text, info)
        if info.state == "cancelled":
            raise JobCancelled(info.id, info)
        if info.state == "expired":
            raise JobExpired(info.id, info)
        raise RuntimeError(f"job {info.id!r} has not ended (state {info.state})")

    async def cancel(self, job_id: str) -> CancelOutcome:
        """Cancel a job: ``"cancelled"`` when it had not started (it never runs),
        ``"cancelling"`` when it is running (its worker is told at once and stops the
        handler within about a second; where the broker cannot push the word, or it does
        not get through, at the job's next lease renewal, within ttl/3; it is not retried
        and ends ``cancelled``), ``"finished"`` when it had
        already ended (nothing changes), ``"unknown"`` when there is no record of it."""
        _check_id(job_id)
        return await self.broker.records.cancel(job_id, self.app.keep_for or DEFAULT_KEEP_FOR)


def _check_id(job_id: object) -> None:
    if not isinstance(job_id, str) or not job_id or len(job_id) > 200:
        raise ConfigError(
            f"job id must be a non-empty string of at most 200 chars, got {quoted(job_id, 60)}"
        )


def _check_timeout(timeout: object) -> None:
    if timeout is None:
        return
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise ConfigError(f"timeout must be a number of seconds > 0 or None, got {quoted(timeout)}")
