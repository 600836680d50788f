"""The schedule marks of a queue's periodic tasks on Redis (``RedisScheduleMarks``, a shared
``ScheduleMarks`` part): one hash, ``aqw:{q}:schedule``, task -> ``"<tick> <job id>"``,
shared by every process, so a new scheduler leader resumes where the last one stopped. A
mark only moves forward (``schedule_mark.lua``)."""

from __future__ import annotations

from redis.asyncio import Redis

from ..._redis import scripts
from ..._redis.keys import QueueKeys
from ..messages import ScheduleMark
from ._entries import text


class RedisScheduleMarks:
    """Read and move the schedule marks of one queue."""

    __slots__ = ("_client", "_key", "_set")

    shared = True

    def __init__(self, client: Redis, keys: QueueKeys) -> None:
        self._client = client
        self._key = keys.schedule
        self._set = scripts.load("schedule_mark")

    async def read(self) -> dict[str, ScheduleMark]:
        raw = await self._client.hgetall(self._key)
        out: dict[str, ScheduleMark] = {}
        for task, value in raw.items():
            mark = ScheduleMark.decode(text(value))
            if mark is not None:
                out[text(task)] = mark
        return out

    async def advance(self, task: str, mark: ScheduleMark) -> None:
        await self._set(self._client, [self._key], [task, repr(mark.tick), mark.encode()])
