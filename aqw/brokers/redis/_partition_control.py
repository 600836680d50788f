"""The operator's controls and the rates of a partitioned queue: ``PartitionedControl``
(a shared ``QueueControl``). The pause is partition 0's (one key that every worker of the
queue reads); the waiting list runs partition by partition, its entry ids marked with their
partition (``<ms>-<seq>~p<N>``); a job is promoted or found in the partition its id names
(else in each in turn). The rates are partition 0's (``PartitionedBroker``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ..messages import WaitingJob
from ._control import RedisQueueControl
from ._partitions import named, split_name


class PartitionedControl:
    """The controls of a queue over ``parts`` (each partition's own control)."""

    shared = True

    def __init__(self, parts: Sequence[RedisQueueControl]) -> None:
        self._parts = tuple(parts)
        self._home = self._parts[0]

    async def pause(self) -> bool:
        return await self._home.pause()

    async def resume(self) -> bool:
        return await self._home.resume()

    async def paused(self) -> bool:
        return await self._home.paused()

    async def waiting_counts(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for counts in await asyncio.gather(*(p.waiting_counts() for p in self._parts)):
            for level, n in counts.items():
                out[level] = out.get(level, 0) + n
        return out

    async def waiting_page(self, level: int, after: str | None, count: int) -> list[WaitingJob]:
        start, entry = 0, None
        if after is not None:
            base, partition = split_name(after, len(self._parts))
            if partition is None:
                return []
            start, entry = partition, base
        out: list[WaitingJob] = []
        for i in range(start, len(self._parts)):
            page = await self._parts[i].waiting_page(level, entry, count - len(out))
            out += [WaitingJob(named(w.entry_id, i), w.level, w.data) for w in page]
            if len(out) >= count:
                break
            entry = None
        return out

    async def delete_waiting(self, level: int, entry_id: str) -> bool:
        base, partition = split_name(entry_id, len(self._parts))
        if partition is None:
            return False
        return await self._parts[partition].delete_waiting(level, base)

    def _candidates(self, job_id: str) -> Sequence[RedisQueueControl]:
        partition = split_name(job_id, len(self._parts))[1]
        return self._parts if partition is None else (self._parts[partition],)

    async def promote(self, job_id: str) -> bool:
        for part in self._candidates(job_id):
            if await part.promote(job_id):
                return True
        return False

    async def find(self, job_id: str) -> bytes | None:
        for part in self._candidates(job_id):
            found = await part.find(job_id)
            if found is not None:
                return found
        return None
