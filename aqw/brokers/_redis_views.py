"""The Redis broker's depth history (``aqw:{q}:depth``, written by ``depth_sample.lua`` once
per bucket from the workers' heartbeats, trimmed to ``DEPTH_KEEP`` seconds) and its page of
the delayed set: what the dashboard reads (``_views.py``)."""

from __future__ import annotations

import contextlib
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from .._redis import scripts
from .._redis.batch import CommandBatcher
from .._redis.keys import GROUP, QueueKeys
from ._redis_levels import RedisLevels
from ._redis_records import text
from ._views import DEPTH_KEEP, DEPTH_SAMPLES, BrokerViews, DelayedJob, DepthSample, bucket_of


class RedisViews(BrokerViews):
    """Depth history and delayed page of a queue on Redis (mixed into ``RedisBroker``)."""

    keys: QueueKeys
    client: Redis
    batcher: CommandBatcher
    levels: RedisLevels

    async def sample_depth(self, at: float) -> None:
        """Add the bucket's sample, summed over the priority levels in use, unless it has one
        (one script call, O(log N)); a damaged key (not a ZSET) is skipped, never failing the
        heartbeat that calls this."""
        k = self.keys
        per_level = [
            key for lv in self.levels.active for key in (k.stream_for(lv), k.delayed_for(lv))
        ]
        with contextlib.suppress(ResponseError):
            await self.batcher.script(
                scripts.load("depth_sample"),
                [k.depth, k.dlq, *per_level],
                [bucket_of(at), DEPTH_KEEP, GROUP],
            )

    async def depth_history(self, since: float) -> list[DepthSample]:
        try:
            raw: Any = await self.client.zrangebyscore(
                self.keys.depth, since, "+inf", start=0, num=DEPTH_SAMPLES
            )
        except ResponseError:  # not a ZSET: no history to show
            return []
        return [s for s in (DepthSample.decode(text(m)) for m in raw) if s is not None]

    async def delayed_page(self, start: int, count: int) -> list[DelayedJob]:
        """Over every priority level in use: each level's first ``start + count``, merged by
        due time. One round trip (the levels set and level 0), and one more when other
        levels are in use."""
        pipe = self.client.pipeline(transaction=False)
        pipe.smembers(self.keys.levels)
        pipe.zrange(self.keys.delayed, 0, start + count - 1, withscores=True)
        members, first = await pipe.execute(raise_on_error=False)
        self.levels.saw([] if isinstance(members, Exception) else members)
        if isinstance(first, Exception):
            raise first
        pages: list[Any] = [first]
        higher = [level for level in self.levels.active if level]
        if higher:
            pipe = self.client.pipeline(transaction=False)
            for level in higher:
                pipe.zrange(self.keys.delayed_for(level), 0, start + count - 1, withscores=True)
            pages += await pipe.execute()
        jobs = [  # the scores are milliseconds since the epoch; a DelayedJob is due in seconds
            DelayedJob(float(due) / 1000, m if isinstance(m, bytes) else m.encode())
            for page in pages
            for m, due in page
        ]
        return sorted(jobs, key=lambda j: j.due)[start : start + count]
