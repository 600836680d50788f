"""Fair shares between the keys of a queue on Redis (``RedisBroker.fair_shares``).

A job with a fairness key is not added to its level's stream at enqueue: it waits in its
key's list (``fair_enqueue.lua``, which describes the keys, all in the queue's slot). A
fetch that finds a level's stream short of what it wants picks the rest from the level's
keys by start-time fair queueing, moves each picked job to the stream and reads it, in the
same script (``fair_fetch.lua``): the active key with the least start tag goes next, and its
tag grows by 1/weight per job, so over a run each key's starts follow its weight, and a key
that starts waiting is tagged with the clock (never behind a key already waiting) and
picked within the next (keys waiting) picks. Workers learn that a level holds fair jobs
from the member ``f<level>`` of the levels set, read with every fetch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._redis import scripts
from ..._redis.batch import CommandBatcher
from ..._redis.keys import QueueKeys
from ..._redis.scripts import ms
from ...job import Job
from ...record import UNFINISHED_KEEP, stamp
from ._priorities import RedisLevels

#: Most jobs one ``fair_enqueue.lua`` call takes.
FAIR_CHUNK = 1000


def fair_base(keys: QueueKeys, level: int) -> str:
    """The prefix of level ``level``'s fair keys: ``aqw:{q}:fair:`` (``fair:pN:`` above 0)."""
    return f"{keys.tag}:fair:p{level}:" if level else f"{keys.tag}:fair:"


class RedisFairShares:
    """The fair turns of one queue's keys."""

    shared = True

    def __init__(self, batcher: CommandBatcher, keys: QueueKeys, levels: RedisLevels) -> None:
        self.batcher = batcher
        self.keys = keys
        self.levels = levels
        self._enqueue = scripts.load("fair_enqueue")
        self._prefix = keys.tag + ":"

    async def publish(self, jobs: Sequence[Job]) -> None:
        by_level: dict[tuple[int, float | None], list[Job]] = {}
        for job in jobs:
            by_level.setdefault((job.priority, job.expires_at), []).append(job)
        for (level, expires), group in by_level.items():
            for start in range(0, len(group), FAIR_CHUNK):
                chunk = group[start : start + FAIR_CHUNK]
                argv: list[Any] = [self._prefix, level, ms(UNFINISHED_KEEP), stamp(expires)]
                for job in chunk:
                    argv += (job.encode(), job.id, job.task, job.enqueued_at)
                    argv += (job.fairness_key, repr(job.fairness_weight))
                keys = [self.keys.levels, fair_base(self.keys, level) + "active"]
                await self.levels.around(chunk, self.batcher.script(self._enqueue, keys, argv))
