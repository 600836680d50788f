"""Limits changed at run time on Redis (``RedisBroker.run_limits``): the hash
``aqw:{q}:limits`` in the queue's slot (``aqw.brokers.parts.RunLimits`` says what it maps),
cached by each worker (``OverrideCache``)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from ..._redis.keys import QueueKeys
from ..local import StoredRunLimits
from ._entries import text

#: Most fields read back (a hash this big was not written by aqw).
MOST_FIELDS = 10_000


class RedisRunLimits(StoredRunLimits):
    def __init__(self, client: Redis, keys: QueueKeys) -> None:
        self.client = client
        self.key = f"{keys.tag}:limits"
        super().__init__()

    async def read(self) -> dict[str, str]:
        raw: Any = await self.client.hgetall(self.key)
        return {text(k): text(v) for k, v in list(raw.items())[:MOST_FIELDS]}

    async def write(self, name: str, value: str | None) -> None:
        if value is None:
            await self.client.hdel(self.key, name)
        else:
            await self.client.hset(self.key, name, value)
