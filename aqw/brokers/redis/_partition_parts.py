"""The parts a partitioned queue (``_partitioned.py``) hands out over its partitions, and
what it reads over all of them: job records in the partition a job's id names
(``PartitionedRecords``), the depth history summed and the delayed page merged
(``PartitionedHistory``), debounce in the partition of the job's key
(``PartitionedDebounce``); the DLQ merged in order, with entry ids that name their
partition (``<ms>-<seq>~p<N>``: the same entry id can be in two streams). Its heartbeats,
schedule marks and limits are partition 0's own parts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from redis.asyncio import Redis

from ..._redis.cluster import gather_on
from ...job import Job
from ...record import DEFAULT_KEEP_FOR, JobInfo
from ..messages import CancelOutcome, DeadJob, DelayedJob, DepthSample
from ._broker import RedisBroker
from ._entries import dead_job_of
from ._partitions import named, partition_of_route, split_name


def summed_history(each: Iterable[list[DepthSample]]) -> list[DepthSample]:
    """The partitions' samples summed per bucket (a bucket some partition has not sampled
    yet counts what the others have)."""
    summed: dict[float, list[int]] = {}
    for samples in each:
        for s in samples:
            counts = summed.setdefault(s.at, [0, 0, 0, 0])
            for i, n in enumerate((s.waiting, s.in_flight, s.delayed, s.dead)):
                counts[i] += n
    return [DepthSample(at, *summed[at]) for at in sorted(summed)]


def merged_delayed(pages: Iterable[list[DelayedJob]], start: int, count: int) -> list[DelayedJob]:
    """Delayed jobs of every partition, soonest first: ``count`` of them from ``start`` (each
    page must hold its partition's first ``start + count``)."""
    merged = sorted((job for page in pages for job in page), key=lambda j: j.due)
    return merged[start : start + count]


async def merged_dlq(parts: Sequence[RedisBroker], count: int, after: str | None) -> list[DeadJob]:
    """Up to ``count`` dead jobs oldest first over every partition (by entry id, then
    partition), after the entry ``after`` names."""
    base, after_p = (None, None) if after is None else split_name(after, len(parts))

    async def page(p: int, part: RedisBroker) -> list[tuple[tuple[int, int, int], DeadJob]]:
        if base is None:
            start = "-"
        elif after_p is None or p <= after_p:
            start = f"({base}"
        else:  # the same entry id in a later partition comes after the cursor
            start = base
        entries: Any = await part.client.xrange(part.keys.dlq, start, "+", count=count)
        out = []
        for entry_id, fields in entries:
            dead = dead_job_of(entry_id, fields)
            ms, _, seq = dead.id.partition("-")
            order = (int(ms or 0), int(seq or 0), p)
            out.append((order, dataclasses.replace(dead, id=named(dead.id, p))))
        return out

    pages = await gather_on(parts[0].client, *(page(p, part) for p, part in enumerate(parts)))
    merged = sorted((item for items in pages for item in items), key=lambda item: item[0])
    return [dead for _, dead in merged[:count]]


async def find_dead(parts: Sequence[RedisBroker], entry_id: str) -> DeadJob | None:
    """The dead job ``entry_id`` names: in its partition, or for an id naming none, the
    first partition that has it."""
    base, p = split_name(entry_id, len(parts))
    for i in range(len(parts)) if p is None else (p,):
        dead = await parts[i].dlq_get(base)
        if dead is not None:
            return dataclasses.replace(dead, id=named(dead.id, i))
    return None


def by_partition(entry_ids: Iterable[str], partitions: int) -> dict[int | None, list[str]]:
    """Entry ids grouped by the partition each names (None: names none), without the mark."""
    groups: dict[int | None, list[str]] = {}
    for entry_id in entry_ids:
        base, p = split_name(entry_id, partitions)
        groups.setdefault(p, []).append(base)
    return groups


async def holder_of(parts: Sequence[RedisBroker], job_id: str) -> RedisBroker | None:
    """The partition holding the record of ``job_id``: the one its id names; for an id
    naming none, the one it hashes to, else the first of the others that has it."""
    p = split_name(job_id, len(parts))[1]
    if p is not None:
        return parts[p]
    first = parts[partition_of_route(job_id, len(parts))]
    if await first.records.record(job_id) is not None:
        return first
    others = [part for part in parts if part is not first]
    found = await gather_on(parts[0].client, *(part.records.record(job_id) for part in others))
    return next((part for part, info in zip(others, found, strict=True) if info), None)


class PartitionedRecords:
    """Job records of a partitioned queue: each job's in the partition its id names (an id
    naming none: where it hashes to, else the first partition that has it)."""

    shared = True

    def __init__(self, client: Redis, parts: Sequence[RedisBroker]) -> None:
        self._client = client
        self._parts = parts

    def _info(self, holder: RedisBroker, info: JobInfo) -> JobInfo:
        """``info`` as read from ``holder``, its DLQ entry's id naming the partition."""
        if not info.dlq_entry:
            return info
        return info.model_copy(
            update={"dlq_entry": named(info.dlq_entry, self._parts.index(holder))}
        )

    def _holders(self, job_id: str) -> Sequence[RedisBroker]:
        """The partitions a write about ``job_id`` goes to: its own, or all for an id that
        names none (the writes act only where the job's record is)."""
        p = split_name(job_id, len(self._parts))[1]
        return self._parts if p is None else (self._parts[p],)

    async def record(self, job_id: str) -> JobInfo | None:
        holder = await holder_of(self._parts, job_id)
        info = None if holder is None else await holder.records.record(job_id)
        return None if info is None or holder is None else self._info(holder, info)

    async def cancel(self, job_id: str, keep_for: float = DEFAULT_KEEP_FOR) -> CancelOutcome:
        holder = await holder_of(self._parts, job_id)
        return "unknown" if holder is None else await holder.records.cancel(job_id, keep_for)

    async def cancel_requested(self, job_id: str) -> bool:
        parts = self._holders(job_id)
        asked = await gather_on(self._client, *(p.records.cancel_requested(job_id) for p in parts))
        return any(asked)

    async def wait_finished(self, job_id: str, timeout: float | None) -> JobInfo:
        holder = await holder_of(self._parts, job_id)
        if holder is None:  # its own partition says UnknownJob
            holder = self._parts[partition_of_route(job_id, len(self._parts))]
        return self._info(holder, await holder.records.wait_finished(job_id, timeout))

    async def set_running_state(self, job_id: str, state: dict[str, str]) -> None:
        parts = self._holders(job_id)
        await gather_on(self._client, *(p.records.set_running_state(job_id, state) for p in parts))

    async def running_state(self, job_id: str) -> dict[str, str] | None:
        parts = self._holders(job_id)
        states = await gather_on(self._client, *(p.records.running_state(job_id) for p in parts))
        return next((s for s in states if s is not None), None)

    async def running_states(self, limit: int = 1000) -> list[dict[str, str]]:
        each = await gather_on(
            self._client, *(p.records.running_states(limit) for p in self._parts)
        )
        return [state for states in each for state in states][:limit]


class PartitionedHistory:
    """The depth history of a partitioned queue: every partition samples its own depth;
    read back, the samples are summed per bucket and the delayed pages merged."""

    shared = True

    def __init__(self, client: Redis, parts: Sequence[RedisBroker]) -> None:
        self._client = client
        self._parts = [part.history for part in parts]

    async def sample(self, at: float) -> None:
        await gather_on(self._client, *(h.sample(at) for h in self._parts if h is not None))

    async def since(self, at: float) -> list[DepthSample]:
        each = await gather_on(self._client, *(h.since(at) for h in self._parts if h is not None))
        return summed_history(each)

    async def delayed_page(self, start: int, count: int) -> list[DelayedJob]:
        pages = await gather_on(
            self._client, *(h.delayed_page(0, start + count) for h in self._parts if h is not None)
        )
        return merged_delayed(pages, start, count)


class PartitionedDebounce:
    """Debounce of a partitioned queue: in the partition of the job (its key's route)."""

    shared = True

    def __init__(self, part_of: Callable[[Job], RedisBroker]) -> None:
        self._part_of = part_of

    async def publish(
        self, job: Job, debounce: float, debounce_max: float | None
    ) -> tuple[str, bool]:
        part = self._part_of(job)
        assert part.debounce is not None
        return await part.debounce.publish(job, debounce, debounce_max)
