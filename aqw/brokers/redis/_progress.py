"""A running job's progress updates as a stream on Redis (``RedisBroker.progress``): the
capped stream ``aqw:{q}:progress:<job id>`` in the queue's slot, trimmed to the last
``PROGRESS_KEEP`` updates and living ``PROGRESS_TTL`` seconds past its last one. Readers
follow it with a blocking ``XREAD`` (no polling)."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis

from ..._redis.batch import CommandBatcher
from ..._redis.client import MAX_BLOCK
from ..._redis.keys import QueueKeys
from ..local.progress import PROGRESS_KEEP, Update
from ._entries import text

#: Seconds a job's progress stream lives past its last update.
PROGRESS_TTL = 3600


class RedisProgress:
    shared = True

    def __init__(self, client: Redis, batcher: CommandBatcher, keys: QueueKeys) -> None:
        self.client = client
        self.batcher = batcher
        self.prefix = f"{keys.tag}:progress:"

    async def publish(self, job_id: str, update: dict[str, str]) -> None:
        key = self.prefix + job_id
        fields = [x for pair in update.items() for x in pair]
        await asyncio.gather(  # one round trip: the batcher sends them together
            self.batcher.execute("XADD", key, "MAXLEN", PROGRESS_KEEP, "*", *fields),
            self.batcher.execute("EXPIRE", key, PROGRESS_TTL),
        )

    async def read(self, job_id: str, after: str, block: float | None) -> list[Update]:
        ms = None if not block else max(1, int(min(block, MAX_BLOCK) * 1000))
        reply: Any = await self.client.xread({self.prefix + job_id: after}, count=1000, block=ms)
        out: list[Update] = []
        for _, entries in reply or []:
            for entry_id, fields in entries:
                out.append((text(entry_id), {text(k): text(v) for k, v in fields.items()}))
        return out
