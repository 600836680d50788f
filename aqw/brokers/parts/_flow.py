"""The parts that decide when a job may start: debounce, rate limits and per-key caps, fair shares,
limits changed at run time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ...job import Job
from ._part import Part


class Debounce(Part, Protocol):
    """Debounced enqueue (``enqueue(..., key=k, debounce=s)``): a burst of enqueues of one
    key runs one job, with the last payload."""

    async def publish(
        self, job: Job, debounce: float, debounce_max: float | None
    ) -> tuple[str, bool]:
        """Enqueue ``job`` (with a ``key`` and the ``aqw-debounce`` header):
        while the job of ``job.key`` still waits in the delayed set, replace its payload and
        headers and move its start to ``aqw.flow.due_time(...)``, keeping its id, atomically;
        else schedule ``job`` itself ``debounce`` seconds from now. Returns (the waiting
        job's id, True when an earlier job was replaced)."""


class FlowLimits(Part, Protocol):
    """What the start step (``Broker.job_lease_backend(job, limits)``) enforces: rate limits
    (GCRA buckets) and per-key caps (counted over the holders' live leases), refusing a start
    over them with ``aqw.RateLimited`` and taking nothing. ``shared``: enforced across every
    worker of the queue, not per process."""

    @property
    def options(self) -> frozenset[str]:
        """The task options enforced, by name (``rate_limit``, ``max_per_key``)."""


@dataclass(frozen=True, slots=True)
class StartLimits:
    """A ``FlowLimits`` whose start step enforces every option."""

    shared: bool
    options: frozenset[str] = frozenset({"rate_limit", "max_per_key"})


class FairShares(Part, Protocol):
    """Fair shares between the keys of a queue (``@app.task(fairness_key=...)``): a job with
    a fairness key waits in its key's turn, and the fetch picks across the keys with jobs
    waiting (within each priority level) by start-time fair queueing on their weights, so a
    key that starts waiting is among the next (keys waiting) picks whatever another key
    holds (``docs/concepts/fairness.md``)."""

    async def publish(self, jobs: Sequence[Job]) -> None:
        """Enqueue ``jobs`` (each with ``fairness_key`` and ``fairness_weight``), due now,
        with their records, into their keys' turns."""


class RunLimits(Part, Protocol):
    """Rate limits and per-key caps changed at run time, stored with the queue: a map of
    ``rate:<task>`` (or ``rate:<task>:<key>``, one rate key's bucket) to a rate
    (``"20/s"``) and ``cap:<task>`` to a most-per-key count (``"3"``), over the values the
    tasks were registered with (``aqw.flow.with_overrides``)."""

    async def read(self) -> dict[str, str]:
        """The stored map."""

    async def write(self, name: str, value: str | None) -> None:
        """Store ``value`` under ``name`` (None: remove it)."""

    async def refresh(self) -> None:
        """Read the map into ``current`` now (a worker's start)."""

    def current(self) -> dict[str, str]:
        """The map as this process last read it, read again in the background (at most
        ``aqw.brokers.local.run_limits.REFRESH_EVERY`` seconds old)."""

    async def stop(self) -> None:
        """Stop the background reads."""
