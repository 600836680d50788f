"""Worker heartbeats and lifetime counters of a queue on Redis, read in bounded amounts and
validated: what ``aqw status``, the monitor and the dashboard see (``RedisWorkerStatus``, a
shared ``WorkerStatus`` part; ``read_stats`` for ``RedisBroker.stats``)."""

from __future__ import annotations

import json
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from ..._readback import damaged_heartbeat, heartbeat_damage, parse_json, to_int
from ..._redis.keys import QueueKeys
from ._entries import text


class RedisWorkerStatus:
    """The heartbeats of one queue (``RedisBroker.status``), shared by every process."""

    shared = True

    def __init__(self, client: Redis, keys: QueueKeys) -> None:
        self._client = client
        self._keys = keys

    async def publish_heartbeat(self, worker: str, data: dict[str, Any], ttl: float) -> None:
        pipe = self._client.pipeline(transaction=False)
        pipe.set(self._keys.worker(worker), json.dumps(data), px=max(1, int(ttl * 1000)))
        pipe.sadd(self._keys.workers, worker)
        await pipe.execute()

    async def heartbeats(self) -> list[dict[str, Any]]:
        """Up to 1000 heartbeats. One that is not JSON, or not of the shape a
        worker or monitor publishes, comes back as ``aqw._readback.damaged_heartbeat``."""
        limit = 1000  # workers read at most: SSCAN, not SMEMBERS, so a forged set is cheap
        names: set[str] = set()
        cursor: Any = 0
        try:
            # Names are cheap next to beats: scan several times the cap, so that which beats
            # are read (the first ``limit`` names in order) does not hang on the set's
            # iteration order, which a server's hash seed decides.
            while True:
                cursor, batch = await self._client.sscan(self._keys.workers, cursor, count=limit)
                names.update(text(n) for n in batch)
                if not int(cursor) or len(names) >= 10 * limit:
                    break
        except ResponseError as exc:  # WRONGTYPE: the workers key is not a set
            return [damaged_heartbeat(self._keys.workers, f"not a set ({exc})")]
        if not names:
            return []
        ordered = sorted(names)[:limit]
        values: Any = await self._client.mget([self._keys.worker(n) for n in ordered])
        gone = [n for n, v in zip(ordered, values, strict=True) if v is None]
        if gone:
            await self._client.srem(self._keys.workers, *gone)
        out: list[dict[str, Any]] = []
        for name, value in zip(ordered, values, strict=True):
            if value is None:
                continue
            beat, problem = parse_json(value)
            problem = problem or heartbeat_damage(beat)
            out.append(beat if problem is None else damaged_heartbeat(name, problem))
        return out

    async def remove_heartbeat(self, worker: str) -> None:
        pipe = self._client.pipeline(transaction=False)
        pipe.delete(self._keys.worker(worker))
        pipe.srem(self._keys.workers, worker)
        await pipe.execute()


async def read_stats(client: Redis, keys: QueueKeys) -> dict[str, int]:
    """The counters of the stats hash (at most 1000 fields); a field that is not an
    integer is left out (``aqw status`` names it)."""
    out: dict[str, int] = {}
    cursor: Any = 0
    try:
        while True:
            reply: Any = await client.hscan(keys.stats, cursor, count=1000)
            cursor, batch = reply
            for k, v in batch.items():
                n = to_int(v, None)
                if n is not None:
                    out[text(k)] = n
            if not int(cursor) or len(out) >= 1000:
                return out
    except ResponseError:  # WRONGTYPE: not a hash; `aqw status` reports it
        return out
