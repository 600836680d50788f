"""One blocking read over the streams of several Redis queues on one server: how a worker
of several queues (``multi.py``) or of a partitioned queue (``_partition_fetch.py``) waits
once all of them are empty, so a job in any of them wakes it at once.

One server only: on Redis Cluster a command reads one slot, and the callers wait on each
queue in turn instead (``RedisBroker.fetch_together`` says None). Never several blocking
reads at once: a cancelled one can be swallowed by the client, or leave entries it took
with this consumer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from redis.asyncio import Redis

from ..._redis.client import CLIENT_ERRORS, MAX_BLOCK
from ..._redis.keys import GROUP, QueueKeys
from ..base import Delivery
from ._entries import delivery_of, text
from ._priorities import FAIR_BLOCK_MS, RedisLevels


class WaitingQueue(Protocol):
    """What one read over several queues needs of each: its client, keys and levels."""

    @property
    def client(self) -> Redis: ...
    @property
    def keys(self) -> QueueKeys: ...
    @property
    def levels(self) -> RedisLevels: ...


async def wait_together(
    queues: Sequence[WaitingQueue], consumer: str, count: int, block: float
) -> list[tuple[int, Delivery]]:
    """Up to ``count`` new deliveries from the streams of every active priority level of
    ``queues`` (one client, one server), waiting up to ``block`` seconds for the first:
    (the index of its queue, the delivery), highest level first."""
    where: dict[str, tuple[int, int]] = {}
    for i, queue in enumerate(queues):
        for level in queue.levels.active:
            where[queue.keys.stream_for(level)] = (i, level)
    block_ms = max(1, int(min(block, MAX_BLOCK) * 1000))
    if any(queue.levels.fair for queue in queues):  # a fair job's enqueue wakes no read
        block_ms = min(block_ms, FAIR_BLOCK_MS)
    try:
        reply: Any = await queues[0].client.xreadgroup(
            GROUP, consumer, dict.fromkeys(where, ">"), count=count, block=block_ms
        )
    except CLIENT_ERRORS as exc:
        if not str(exc).startswith("NOGROUP"):
            raise
        await asyncio.gather(*(queue.levels.ensure_groups() for queue in queues))
        return []
    out: list[tuple[int, Delivery]] = []
    for stream, entries in sorted(reply or [], key=lambda r: -where[text(r[0])][1]):
        i, level = where[text(stream)]
        for entry_id, fields in entries:
            if fields:
                delivery = delivery_of(entry_id, fields)
                delivery.level, delivery.receipt = level, consumer
                out.append((i, delivery))
    return out
