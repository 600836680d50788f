"""``LocalBatchCounts``: batches (``aqw.brokers.batching``) kept in this process, for a broker
whose whole queue lives here (the memory broker).

The broker's settle steps (``Broker.ack``, ``Broker.dead_letter``) call ``settled`` right
after their own step, with no await in between: in one process that is one atomic step. A
child counts once, by leaving its batch's set of unfinished children; the count that brings
a sealed batch to zero enqueues its callbacks in the same step, each under its idempotency
key (``batch:<id>:<kind>``), and counts the batch in its parent batch when it has one.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ...errors import ConfigError
from ...job import Job
from ..batching import (
    BATCH_HEADER,
    BATCH_INFO_HEADER,
    CALLBACK_KINDS,
    BatchInfo,
    BatchSpec,
    BatchState,
    callback_key,
    counted_as,
)
from .clock import clock

#: Publish one job now: (job, idempotency key or None, key ttl) -> False when the key is
#: taken (nothing published). Synchronous: it is part of the counting step.
Enqueue = Callable[[Job, str | None, float], bool]
#: Cancel one job by id (its record), as ``app.cancel`` does.
Cancel = Callable[[str], Awaitable[object]]
#: A finished job's result as JSON text (None: none kept).
ResultOf = Callable[[str], "str | None"]
#: End a job that never ran: (job, state, keep_for) writes its final record.
EndUnrun = Callable[[Job, str, float], None]

#: How long a batch that never completes is kept (as an unfinished job record is).
OPEN_KEEP = 7 * 86_400.0


@dataclass
class _Batch:
    spec: BatchSpec
    state: BatchState = "open"
    todo: set[str] = field(default_factory=set)
    children: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    fired: dict[str, str] = field(default_factory=dict)
    created_at: float = field(default_factory=clock.time)
    completed_at: float | None = None
    until: float = field(default_factory=lambda: clock.monotonic() + OPEN_KEEP)


class LocalBatchCounts:
    """Batches in this process (``shared`` False): the ``BatchCounts`` part of the memory
    broker, with ``settled``, the count its settle steps make."""

    shared = False

    def __init__(
        self, enqueue: Enqueue, cancel: Cancel, result_of: ResultOf, end_unrun: EndUnrun
    ) -> None:
        self._enqueue = enqueue
        self._cancel = cancel
        self._result_of = result_of
        self._end_unrun = end_unrun
        self._batches: dict[str, _Batch] = {}
        #: An unfinished child's job id -> the batches it counts in (the settle steps look a
        #: job up here before calling ``settled``: a job of no batch pays one lookup).
        self.counting: dict[str, list[str]] = {}
        self._failing: list[_Batch] = []  # fail_fast batches whose children are to stop

    def _get(self, batch_id: str) -> _Batch | None:
        b = self._batches.get(batch_id)
        if b is not None and b.until <= clock.monotonic():
            del self._batches[batch_id]
            return None
        return b

    def _open(self, batch_id: str) -> _Batch:
        b = self._get(batch_id)
        if b is None:
            raise ConfigError(f"batch {batch_id!r}: no such batch (unknown id, or expired)")
        if b.state != "open":
            raise ConfigError(f"batch {batch_id!r} is {b.state}: no child can be added to it")
        return b

    async def open(self, spec: BatchSpec) -> None:
        parent = self._open(spec.parent) if spec.parent is not None else None
        if spec.id in self._batches:
            raise ConfigError(f"batch {spec.id!r} exists already")
        b = self._batches[spec.id] = _Batch(spec, state="sealed" if spec.sealed else "open")
        b.todo.update(spec.members)
        b.children.extend(spec.members)
        if parent is not None:
            member = f"batch:{spec.id}"
            parent.todo.add(member)
            parent.children.append(member)

    async def add(self, batch_id: str, jobs: list[Job]) -> None:
        b = self._open(batch_id)
        for job in jobs:
            if job.id not in b.todo:  # a member known ahead (a flow's step) is not added twice
                b.todo.add(job.id)
                b.children.append(job.id)
            self.counting[job.id] = _batches_of(job, batch_id)
            self._enqueue(job, None, 0.0)

    async def seal(self, batch_id: str) -> BatchInfo:
        b = self._get(batch_id)
        if b is None:
            raise ConfigError(f"batch {batch_id!r}: no such batch (unknown id, or expired)")
        if b.state == "open":
            b.state = "sealed"
            if not b.todo:
                self._fire(b)
        await self._stop_failing()
        return self._info(b)

    async def info(self, batch_id: str) -> BatchInfo | None:
        b = self._get(batch_id)
        return None if b is None else self._info(b)

    async def children(self, batch_id: str, start: int, count: int) -> list[str]:
        b = self._get(batch_id)
        return [] if b is None else b.children[max(0, start) : max(0, start) + max(0, count)]

    async def cancel(self, batch_id: str) -> BatchInfo | None:
        b = self._get(batch_id)
        if b is None:
            return None
        if b.state == "open":
            b.state = "sealed"
        await self._stop_children(b)
        if b.state == "sealed" and not b.todo:
            self._fire(b)
        await self._stop_failing()
        return self._info(b)

    # -- the count of the settle steps --------------------------------------------------

    async def settled(self, job_id: str, state: str) -> None:
        """Count job ``job_id``'s final ``state`` in its batch, once (nothing for a job of
        no batch, or one that counted already); called by the settle step that ended it.
        The count is made before the first await; a ``fail_fast`` batch's other children
        are then cancelled."""
        for batch_id in self.counting.pop(job_id, ()):
            self._count(batch_id, job_id, state)
        await self._stop_failing()

    async def _stop_failing(self) -> None:
        """Stop the children of the ``fail_fast`` batches a count just failed (a nested
        batch that failed counts so in its parent, and stops it too)."""
        while self._failing:
            await self._stop_children(self._failing.pop())

    def _count(self, batch_id: str, member: str, state: str) -> _Batch | None:
        b = self._get(batch_id)
        if b is None or member not in b.todo:
            return None
        b.todo.discard(member)
        kind = counted_as(state)
        b.counts[kind] = b.counts.get(kind, 0) + 1
        if kind == "failed" and b.spec.fail_fast:
            self._failing.append(b)
        if not b.todo and b.state == "sealed":
            self._fire(b)
        return b

    async def _stop_children(self, b: _Batch) -> None:
        for child in list(b.todo):
            if child.startswith("batch:"):
                await self.cancel(child.removeprefix("batch:"))
            else:
                await self._cancel(child)

    def _fire(self, b: _Batch) -> None:
        """The batch is complete: its callbacks enqueued, each once, and the batch counted
        in its parent."""
        b.state = "complete"
        b.completed_at = clock.time()
        b.until = clock.monotonic() + b.spec.keep_for
        due = [k for k in CALLBACK_KINDS if k in b.spec.callbacks and _due(k, self._info(b))]
        b.fired = {k: b.spec.callbacks[k].id for k in due}  # what ctx.batch says was enqueued
        info = self._info(b)
        for kind in CALLBACK_KINDS:
            job = b.spec.callbacks.get(kind)
            if job is None:
                continue
            if kind not in due:
                if BATCH_HEADER in job.headers:  # a flow step its gate does not enqueue
                    self._end_unrun(job, "cancelled", b.spec.keep_for)
                    for batch_id in _batches_of(job, ""):
                        self._count(batch_id, job.id, "cancelled")
                continue
            update: dict[str, object] = {}
            if BATCH_INFO_HEADER in job.headers:
                update["headers"] = {**job.headers, BATCH_INFO_HEADER: info.to_json()}
            if b.spec.inputs:
                update["payload"] = self._input(b)
            filled = job.model_copy(update=update)
            if not self._enqueue(filled, callback_key(b.spec.id, kind), b.spec.key_ttl):
                del b.fired[kind]
            elif BATCH_HEADER in job.headers:
                self.counting[job.id] = _batches_of(job, "")
        if b.spec.parent is not None:
            self._count(b.spec.parent, f"batch:{b.spec.id}", info.outcome)

    def _input(self, b: _Batch) -> object:
        """A flow step's payload: its one parent's result, or a mapping of each parent's
        step name to its result (None for a result not kept); a batch parent's children's
        results (input names ending in ``[]``) gathered, in order, into one list."""
        parts: dict[str, Any] = {}
        for name, job_id in zip(b.spec.inputs, b.children, strict=False):
            text = self._result_of(job_id)
            value = None if text is None else json.loads(text)
            if name.endswith("[]"):
                parts.setdefault(name[:-2], []).append(value)
            else:
                parts[name] = value
        if len(parts) == 1:
            return next(iter(parts.values()))
        return parts

    def _info(self, b: _Batch) -> BatchInfo:
        c = b.counts
        return BatchInfo(
            id=b.spec.id,
            state=b.state,
            total=len(b.children),
            pending=len(b.todo),
            succeeded=c.get("succeeded", 0),
            failed=c.get("failed", 0),
            cancelled=c.get("cancelled", 0),
            expired=c.get("expired", 0),
            fail_fast=b.spec.fail_fast,
            parent=b.spec.parent,
            created_at=b.created_at,
            completed_at=b.completed_at,
            callbacks=dict(b.fired),
            data=b.spec.data,
        )


def _batches_of(job: Job, default: str) -> list[str]:
    """The batches a child counts in: its ``BATCH_HEADER``'s ids (a flow step counts in its
    flow and its dependants' gates), else ``default``."""
    return job.headers.get(BATCH_HEADER, default).split()


def _due(kind: str, info: BatchInfo) -> bool:
    """Whether a complete batch enqueues its ``kind`` callback: ``complete`` always,
    ``success`` when every child succeeded, ``failure`` when one failed."""
    if kind == "success":
        return info.succeeded == info.total
    if kind == "failure":
        return info.failed > 0
    return True
