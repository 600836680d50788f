"""The depth history of a queue on Redis (``aqw:{q}:depth``, written by ``depth_sample.lua``
once per bucket from the workers' heartbeats, trimmed to ``DEPTH_KEEP`` seconds) and its
page of the delayed set: ``RedisDepthHistory``, a shared ``DepthHistory`` part."""

from __future__ import annotations

import contextlib
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from ..._redis import scripts
from ..._redis.batch import CommandBatcher
from ..._redis.keys import GROUP, QueueKeys
from ..messages import DEPTH_KEEP, DEPTH_SAMPLES, DelayedJob, DepthSample, bucket_of
from ._entries import text
from ._priorities import RedisLevels


class RedisDepthHistory:
    """Depth history and delayed page of one queue (``RedisBroker.history``)."""

    shared = True

    def __init__(
        self, client: Redis, batcher: CommandBatcher, keys: QueueKeys, levels: RedisLevels
    ) -> None:
        self._client = client
        self._batcher = batcher
        self._keys = keys
        self._levels = levels
        self._sample = scripts.load("depth_sample")

    def _fair_counts(self) -> list[str]:
        """The counters of the jobs waiting in fair shares, per level holding them."""
        tag = self._keys.tag
        return [
            f"{tag}:fair:p{lv}:n" if lv else f"{tag}:fair:n" for lv in sorted(self._levels.fair)
        ]

    async def sample(self, at: float) -> None:
        """Add the bucket's sample, summed over the priority levels in use, unless it has one
        (one script call, O(log N)); a damaged key (not a ZSET) is skipped, never failing the
        heartbeat that calls this."""
        k = self._keys
        per_level = [
            key for lv in self._levels.active for key in (k.stream_for(lv), k.delayed_for(lv))
        ]
        with contextlib.suppress(ResponseError):
            await self._batcher.script(
                self._sample,
                [k.depth, k.dlq, *per_level],
                [bucket_of(at), DEPTH_KEEP, GROUP, *self._fair_counts()],
            )

    async def since(self, at: float) -> list[DepthSample]:
        try:
            raw: Any = await self._client.zrangebyscore(
                self._keys.depth, at, "+inf", start=0, num=DEPTH_SAMPLES
            )
        except ResponseError:  # not a ZSET: no history to show
            return []
        return [s for s in (DepthSample.decode(text(m)) for m in raw) if s is not None]

    async def delayed_page(self, start: int, count: int) -> list[DelayedJob]:
        """Over every priority level in use: each level's first ``start + count``, merged by
        due time. One round trip (the levels set and level 0), and one more when other
        levels are in use."""
        keys = self._keys
        pipe = self._client.pipeline(transaction=False)
        pipe.smembers(keys.levels)
        pipe.zrange(keys.delayed, 0, start + count - 1, withscores=True)
        members, first = await pipe.execute(raise_on_error=False)
        self._levels.saw([] if isinstance(members, Exception) else members)
        if isinstance(first, Exception):
            raise first
        pages: list[Any] = [first]
        higher = [level for level in self._levels.active if level]
        if higher:
            pipe = self._client.pipeline(transaction=False)
            for level in higher:
                pipe.zrange(keys.delayed_for(level), 0, start + count - 1, withscores=True)
            pages += await pipe.execute()
        jobs = [  # the sets are scored in milliseconds
            DelayedJob(float(due) / 1000, m if isinstance(m, bytes) else m.encode())
            for page in pages
            for m, due in page
        ]
        return sorted(jobs, key=lambda j: j.due)[start : start + count]
