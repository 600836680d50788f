"""``Batch``: jobs whose callbacks are enqueued exactly once, when the last of them is final.

``async with app.batch(on_complete=..., payload=...) as batch:`` opens the batch on its
queue's broker (its ``batches`` part), ``batch.enqueue`` adds children (each one queued and
counted in one step), and leaving the block seals it: only then can it complete. Leaving it
by an exception cancels the batch instead (its children that have not started end
cancelled; its callbacks fire once the rest are final). The counting is the broker's, in
each child's settle step (``aqw.brokers.batching``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Protocol

from .._ids import new_job_id
from ..brokers import Broker
from ..brokers.batching import (
    BATCH_HEADER,
    BATCH_INFO_HEADER,
    BATCH_INFO_SLOT,
    BatchInfo,
    BatchSpec,
    callback_key,
)
from ..brokers.parts import BatchCounts
from ..errors import ConfigError
from ..job import Job
from ..task import Enqueued, Task
from ..telemetry import BATCH_TRACE_HEADER, SPAN_BATCH_OPEN, Telemetry, opening


class BatchApp(Protocol):
    """What a batch needs of the App."""

    @property
    def queue(self) -> str: ...
    @property
    def keep_for(self) -> float: ...
    @property
    def idempotency_ttl(self) -> float: ...
    def broker_for(self, queue: str) -> Broker: ...
    def telemetry_for(self, queue: str) -> Telemetry: ...


#: Builds checked jobs: (task, payloads, headers, queue, idempotency key) -> jobs.
Build = Callable[[Task[Any], Sequence[Any], dict[str, str], str, "str | None"], list[Job]]


def batch_part(broker: Broker) -> BatchCounts:
    """The broker's batch counts, or a ConfigError saying which brokers have them."""
    part = broker.batches
    if part is None:
        raise ConfigError(
            f"batch: {broker.describe()} keeps no batch counts (they move in each child's "
            "settle step): batches and flows run on one Redis queue (not partitioned), "
            "memory://, or SQS with records=redis:// or records=postgresql://"
        )
    return part


class Batch:
    """A batch of jobs (``app.batch``): an async context manager; ``id`` is its id,
    ``info`` its ``BatchInfo`` once the block has exited."""

    def __init__(
        self,
        app: BatchApp,
        build: Build,
        *,
        on_complete: Task[Any] | None = None,
        on_success: Task[Any] | None = None,
        on_failure: Task[Any] | None = None,
        payload: Any = None,
        fail_fast: bool = False,
        queue: str | None = None,
        parent: str | None = None,
    ) -> None:
        if not isinstance(fail_fast, bool):
            raise ConfigError(f"batch fail_fast must be True or False, got {fail_fast!r}")
        self.id = new_job_id()
        self.queue = queue if queue is not None else app.queue
        self._app, self._build = app, build
        self._part = batch_part(app.broker_for(self.queue))
        self._tasks: dict[str, Task[Any]] = {}
        for kind, task in (
            ("complete", on_complete),
            ("success", on_success),
            ("failure", on_failure),
        ):
            if task is None:
                continue
            if not isinstance(task, Task):
                raise ConfigError(f"batch on_{kind} must be a task (@app.task), got {task!r}")
            self._tasks[kind] = task
        self._payload = payload
        callbacks = self._callbacks({})
        self._spec = BatchSpec(
            self.id,
            callbacks,
            fail_fast,
            keep_for=app.keep_for,
            key_ttl=app.idempotency_ttl,
            parent=parent,
        )
        self._opened = False
        self._span: AbstractContextManager[str | None] | None = None
        #: The batch's state once the block has exited (sealed, or cancelled).
        self.info: BatchInfo | None = None

    def _callbacks(self, headers: dict[str, str]) -> dict[str, Job]:
        """The callbacks' jobs (their payloads checked here), with ``headers`` besides."""
        head = {**headers, BATCH_INFO_HEADER: BATCH_INFO_SLOT}
        out: dict[str, Job] = {}
        for kind, task in self._tasks.items():
            key = callback_key(self.id, kind)
            (out[kind],) = self._build(task, [self._payload], head, self.queue, key)
        return out

    async def __aenter__(self) -> Batch:
        if self._opened:
            raise ConfigError(f"batch {self.id!r} is opened once")
        span = opening(self._app.telemetry_for(self.queue), SPAN_BATCH_OPEN, self.id)
        trace = span.__enter__()  # the block's span: the callbacks' spans link to it
        if trace is not None and self._tasks:  # built anew: a job's headers are fixed
            callbacks = self._callbacks({BATCH_TRACE_HEADER: trace})
            self._spec = dataclasses.replace(self._spec, callbacks=callbacks)
        try:
            await self._part.open(self._spec)
        except BaseException as exc:
            span.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self._span, self._opened = span, True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc_type is None:
                self.info = await self._part.seal(self.id)
            else:
                self.info = await self._part.cancel(self.id)
        finally:
            if self._span is not None:
                self._span.__exit__(exc_type, exc, tb)

    async def enqueue(self, task: Task[Any], payload: Any = None) -> Enqueued:
        """Enqueue one child of ``task``; its id."""
        (job_id,) = await self.enqueue_many(task, [payload])
        return job_id

    async def enqueue_many(self, task: Task[Any], payloads: Sequence[Any]) -> list[Enqueued]:
        """Enqueue one child of ``task`` per payload, validated first (one bad payload
        enqueues none); their ids."""
        if not self._opened or self.info is not None:
            raise ConfigError(
                f"batch {self.id!r}: enqueue inside `async with app.batch(...) as batch:`; "
                "leaving the block seals the batch"
            )
        if not isinstance(task, Task):
            raise ConfigError(f"batch.enqueue: task must be a task (@app.task), got {task!r}")
        jobs = self._build(task, list(payloads), {BATCH_HEADER: self.id}, self.queue, None)
        if jobs:
            await self._part.add(self.id, jobs)
        return [Enqueued(job.id) for job in jobs]

    def batch(
        self,
        *,
        on_complete: Task[Any] | None = None,
        on_success: Task[Any] | None = None,
        on_failure: Task[Any] | None = None,
        payload: Any = None,
        fail_fast: bool = False,
    ) -> Batch:
        """A batch inside this one: it counts here as one child, once its own callbacks are
        enqueued (succeeded when all its children succeeded, failed when one failed)."""
        if not self._opened or self.info is not None:
            raise ConfigError(f"batch {self.id!r}: open a nested batch inside the block")
        return Batch(
            self._app,
            self._build,
            on_complete=on_complete,
            on_success=on_success,
            on_failure=on_failure,
            payload=payload,
            fail_fast=fail_fast,
            queue=self.queue,
            parent=self.id,
        )
