"""What a partitioned queue (``partitioned.py``) reads over all of its partitions: the
depth history summed, the delayed page and the DLQ merged in order, DLQ entry
ids that name their partition (``<ms>-<seq>~p<N>``: the same entry id can be in two
streams), and the partition holding a job's record."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from ..._redis.cluster import gather_on
from ..base import DeadJob
from ..local.history import DelayedJob, DepthSample
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
    if await first.record(job_id) is not None:
        return first
    others = [part for part in parts if part is not first]
    found = await gather_on(parts[0].client, *(part.record(job_id) for part in others))
    return next((part for part, info in zip(others, found, strict=True) if info), None)
