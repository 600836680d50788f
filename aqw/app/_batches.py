"""The App's batch and flow calls (``app.batch``, ``app.batch_info``, ``app.batch_results``,
``app.cancel_batch``, ``app.start``, ``app.flow_info``), written as functions of the App and
bound in its class body."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from functools import partial
from typing import Any, Protocol

from ..brokers import Broker
from ..brokers.batching import BatchInfo
from ..errors import ConfigError
from ..job import Job
from ..task import Task
from ..telemetry import Telemetry
from ..workflows import Batch, Flow, FlowInfo, batch_part, flow_info, start_flow
from ._jobs import Jobs
from ._producing import build_jobs


class BatchesApp(Protocol):
    """What the batch calls need of the App."""

    @property
    def queue(self) -> str: ...
    @property
    def keep_for(self) -> float: ...
    @property
    def idempotency_ttl(self) -> float: ...
    @property
    def broker(self) -> Broker: ...
    @property
    def tasks(self) -> dict[str, Task[Any]]: ...
    def broker_for(self, queue: str) -> Broker: ...
    def telemetry_for(self, queue: str) -> Telemetry: ...


def _build(
    app: BatchesApp,
    task: Task[Any],
    payloads: Sequence[Any],
    headers: dict[str, str],
    queue: str,
    key: str | None,
) -> list[Job]:
    return build_jobs(app, task, payloads, headers, queue, key)


def open_batch(
    app: BatchesApp,
    *,
    on_complete: Task[Any] | None = None,
    on_success: Task[Any] | None = None,
    on_failure: Task[Any] | None = None,
    payload: Any = None,
    fail_fast: bool = False,
    queue: str | None = None,
) -> Batch:
    """A batch of jobs: ``async with app.batch(on_complete=t, payload=p) as batch:``, then
    ``await batch.enqueue(task, payload)``; leaving the block seals it. When every child is
    final (succeeded, dead, cancelled, expired), ``on_complete`` is enqueued, ``on_success``
    when all succeeded, ``on_failure`` when one failed: each exactly once, with ``payload``,
    its handler seeing the counts as ``ctx.batch``. ``fail_fast``: the first failed child
    cancels the others. See docs/concepts/workflows.md."""
    return Batch(
        app,
        partial(_build, app),
        on_complete=on_complete,
        on_success=on_success,
        on_failure=on_failure,
        payload=payload,
        fail_fast=fail_fast,
        queue=queue,
    )


def _check(batch_id: object) -> str:
    if not isinstance(batch_id, str) or not batch_id:
        raise ConfigError(f"batch id must be a non-empty string, got {batch_id!r}")
    return batch_id


async def batch_info(
    app: BatchesApp, batch_id: str, *, queue: str | None = None
) -> BatchInfo | None:
    """The batch's ``BatchInfo`` (state, total, pending and each count, the callbacks
    enqueued), or None: an unknown id, or a batch past its ``keep_for``."""
    return await batch_part(app.broker_for(queue or app.queue)).info(_check(batch_id))


async def batch_results(
    app: BatchesApp, batch_id: str, *, start: int = 0, count: int = 100, queue: str | None = None
) -> dict[str, Any]:
    """One page of the batch's children's results, job id -> result (those whose task keeps
    results, ``keep_result=True``, and that succeeded), in the order they were added:
    children ``start`` to ``start + count``."""
    broker = app.broker_for(queue or app.queue)
    ids = await batch_part(broker).children(_check(batch_id), start, count)
    jobs = Jobs(app)
    out: dict[str, Any] = {}
    for job_id in ids:
        info = None if job_id.startswith("batch:") else await broker.records.record(job_id)
        if info is not None and info.state == "succeeded" and info.has_result:
            out[job_id] = jobs.outcome(info)
    return out


async def cancel_batch(
    app: BatchesApp, batch_id: str, *, queue: str | None = None
) -> BatchInfo | None:
    """Cancel the batch: its children that have not started end cancelled, the running ones
    are asked to stop, and it is sealed (its callbacks fire once the rest are final). None
    for an unknown batch."""
    return await batch_part(app.broker_for(queue or app.queue)).cancel(_check(batch_id))


class FlowHandle:
    """A started flow (``app.start``): ``id``, ``info()`` and ``result()``."""

    def __init__(self, app: BatchesApp, flow_id: str, queue: str) -> None:
        self.app, self.id, self.queue = app, flow_id, queue

    async def info(self) -> FlowInfo | None:
        """The flow's state and each step's (``app.flow_info``)."""
        return await flow_info(self.app, self.id, self.queue)

    async def result(self, timeout: float | None = None) -> Any:
        """Once every step is final: the result of the flow's last step (the one no step
        runs after; a batch step's: its children's results, in order), or a mapping of
        name to result when there are several; a last step
        that failed or was cancelled raises as ``app.result`` does. Raises
        ``TimeoutError`` after ``timeout`` seconds (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.01
        while True:
            info = await self.info()
            if info is None:
                raise ConfigError(f"flow {self.id!r}: no such flow (unknown id, or expired)")
            if info.state == "complete":
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"flow {self.id!r} has not ended after {timeout} s")
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.5)
        ends = [
            s
            for s in info.steps.values()
            if not any(s.name in o.after for o in info.steps.values())
        ]
        jobs = Jobs(self.app)
        out = {}
        for step in ends:
            if step.batch is not None:  # a batch step: its children's results, in order
                out[step.name] = await self._children(jobs, step.job_id, step.batch.total)
                continue
            if step.record is None:
                raise ConfigError(f"flow {self.id!r}: the record of step {step.name!r} expired")
            out[step.name] = jobs.outcome(step.record)
        return next(iter(out.values())) if len(out) == 1 else out

    async def _children(self, jobs: Jobs, batch_id: str, total: int) -> list[Any]:
        """A batch step's children's results, in order; the first child that did not
        succeed raises as ``app.result`` does."""
        broker = self.app.broker_for(self.queue)
        results = []
        for job_id in await batch_part(broker).children(batch_id, 0, total):
            record = await broker.records.record(job_id)
            if record is None:
                raise ConfigError(f"flow {self.id!r}: the record of job {job_id!r} expired")
            results.append(jobs.outcome(record))
        return results


async def start(app: BatchesApp, flow: Flow, *, queue: str | None = None) -> FlowHandle:
    """Start a flow (``aqw.Flow``): its first steps are enqueued now, each later one by the
    settle step of its last parent, with their results as its input. Its handle."""
    queue = queue or app.queue
    flow_id = await start_flow(app, partial(_build, app), flow, queue)
    return FlowHandle(app, flow_id, queue)


async def flow_info_of(
    app: BatchesApp, flow_id: str, *, queue: str | None = None
) -> FlowInfo | None:
    """The flow's state (``complete`` once every step is final) and each step's (its job's
    record's state; ``waiting`` while its parents run), or None for an unknown flow."""
    return await flow_info(app, _check(flow_id), queue or app.queue)
