"""The parts behind workflows and operators: batch counts, queue control, rates, and
streamed progress."""

from __future__ import annotations

from typing import Protocol

from ...job import Job
from ..batching import BatchInfo, BatchSpec
from ..messages import (
    WaitingJob,
)
from ..tallies import TaskTally
from ._part import Part


class BatchCounts(Part, Protocol):
    """A batch's children and counts (``aqw.brokers.batching``). The counting itself is not a
    method: a broker's settle steps count a child (found by its record or its job id) once,
    in the same atomic step as its own settle, by its membership in the batch's set of
    unfinished children, and the step that brings a sealed batch to zero enqueues its
    callbacks under their idempotency keys (``batch:<id>:<kind>``), in that same step.
    Every key of a batch lives where its queue's keys live (Redis: the queue's slot)."""

    async def open(self, spec: BatchSpec) -> None:
        """Create batch ``spec.id``, open (children may be added; it cannot complete), with
        its callbacks' jobs; when ``spec.parent`` is set, the new batch is added to that
        (open) batch as one child in the same step."""

    async def add(self, batch_id: str, jobs: list[Job]) -> None:
        """Enqueue ``jobs`` now as children of the open batch ``batch_id``, each one and its
        membership in one atomic step (a child is never queued uncounted). Raises
        ``aqw.ConfigError`` naming the batch when it is sealed or unknown: nothing written."""

    async def seal(self, batch_id: str) -> BatchInfo:
        """Seal the batch: no child can be added from now on; when none is unfinished, the
        batch completes in this step (its callbacks enqueued). Its state after the step."""

    async def info(self, batch_id: str) -> BatchInfo | None:
        """The batch's counts now, or None (unknown id, or expired)."""

    async def children(self, batch_id: str, start: int, count: int) -> list[str]:
        """Up to ``count`` of the batch's children's job ids from position ``start``, in the
        order they were added (a nested batch is named ``batch:<id>``)."""

    async def cancel(self, batch_id: str) -> BatchInfo | None:
        """Cancel the batch's children that have not started (counted cancelled at once),
        ask the running ones to stop, seal it: its callbacks fire once the rest are final."""


class QueueControl(Part, Protocol):
    """What an operator does to a queue (``aqw queue``, the dashboard): pause and resume
    it (workers stop fetching from a paused queue: they read ``paused`` about once a
    second, never per job), list its waiting jobs per priority level, delete a waiting job
    and run a delayed one now."""

    async def pause(self) -> bool:
        """Pause the queue; False when it was paused already."""

    async def resume(self) -> bool:
        """Resume the queue; False when it was not paused."""

    async def paused(self) -> bool:
        """True while the queue is paused (one cheap read)."""

    async def waiting_counts(self) -> dict[int, int]:
        """Jobs waiting (not yet delivered) per priority level in use, level 0 always."""

    async def waiting_page(self, level: int, after: str | None, count: int) -> list[WaitingJob]:
        """Up to ``count`` waiting jobs of ``level``, oldest first, after entry ``after``."""

    async def delete_waiting(self, level: int, entry_id: str) -> bool:
        """Delete a waiting entry that no worker has taken; False when it is gone or was
        taken meanwhile (a running job is cancelled, not deleted)."""

    async def promote(self, job_id: str) -> bool:
        """Make the delayed job ``job_id`` due now (the workers move it to the queue on
        their next pass); False when no delayed job has that id."""

    async def find(self, job_id: str) -> bytes | None:
        """The wire form of job ``job_id`` while it waits, runs or is delayed (a bounded
        search: the first few thousand of each), or None."""


class JobRates(Part, Protocol):
    """Throughput, failures and durations per task over time, kept bounded: per-minute
    buckets for ``MINUTE_KEEP`` seconds and per-hour buckets for ``HOUR_KEEP`` seconds.
    Workers add what they counted in their heartbeat (one write per heartbeat, never one
    per job)."""

    async def add(self, tallies: dict[float, dict[str, TaskTally]]) -> None:
        """Add each minute's tallies (minute start -> task -> tally) to its minute bucket
        and to the hour bucket holding it."""

    async def read(self, since: float, hourly: bool) -> dict[float, dict[str, TaskTally]]:
        """The buckets (minute or hour start -> task -> tally) from ``since`` on."""


class ProgressStream(Part, Protocol):
    """A running job's progress updates (``ctx.progress``) as a bounded stream per job that
    readers follow (``app.progress``), best effort: a reader that lags past the kept updates
    loses the oldest."""

    async def publish(self, job_id: str, update: dict[str, str]) -> None:
        """Append ``update`` (``fraction``, ``message``, ``detail`` as JSON) to the job's
        stream."""

    async def read(
        self, job_id: str, after: str, block: float | None
    ) -> list[tuple[str, dict[str, str]]]:
        """The job's updates after the id ``after`` ("0": every one kept), oldest first,
        each (its id, its fields with ``at``), waiting up to ``block`` seconds for one."""
