"""Running-job states, worker heartbeats and lifetime counters of a queue on Redis, read in
bounded amounts and validated: what ``aqw status``, the monitor and ``app.job_status`` see."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from .._damage import check_job_state, damaged_heartbeat, heartbeat_damage, parse_json, to_int
from .._redis.batch import CommandBatcher
from .._redis.keys import QueueKeys
from ._redis_records import text


class RedisStatus:
    """The status records of one queue (``RedisBroker.status``)."""

    def __init__(self, client: Redis, batcher: CommandBatcher, keys: QueueKeys) -> None:
        self._client = client
        self._batcher = batcher
        self._keys = keys

    async def set_job_state(self, job_id: str, state: dict[str, str], ttl: float) -> None:
        key = self._keys.job_state(job_id)
        fields = [x for pair in state.items() for x in pair]
        started = float(state.get("started_at", 0) or time.time())
        await asyncio.gather(
            self._batcher.execute("HSET", key, *fields),
            self._batcher.execute("PEXPIRE", key, max(1, int(ttl * 1000))),
            self._batcher.execute("ZADD", self._keys.running, started, job_id),
        )

    async def clear_job_state(self, job_id: str) -> None:
        await asyncio.gather(
            self._batcher.execute("DEL", self._keys.job_state(job_id)),
            self._batcher.execute("ZREM", self._keys.running, job_id),
        )

    async def job_state(self, job_id: str) -> dict[str, str] | None:
        # A state whose numbers do not parse gets a "damaged" note (aqw._damage).
        try:
            raw: Any = await self._client.hgetall(self._keys.job_state(job_id))
        except ResponseError as exc:  # WRONGTYPE: someone wrote another type at the key
            return {"job_id": job_id, "damaged": f"the state key is not a hash ({exc})"}
        if not raw:
            return None
        return check_job_state({text(k): text(v) for k, v in raw.items()})

    async def job_states(self, limit: int = 1000) -> list[dict[str, str]]:
        limit = max(1, min(limit, 10_000))
        ids: Any = await self._client.zrange(self._keys.running, 0, limit - 1)
        if not ids:
            return []
        pipe = self._client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(self._keys.job_state(text(job_id)))
        states: Any = await pipe.execute(raise_on_error=False)
        gone = [job_id for job_id, raw in zip(ids, states, strict=True) if not raw]
        if gone:  # their worker died: the state expired, the index entry stayed
            await self._client.zrem(self._keys.running, *gone)
        out = []
        for job_id, raw in zip(ids, states, strict=True):
            if isinstance(raw, Exception):  # WRONGTYPE: not a hash
                damage = f"the state key is not a hash ({raw})"
                out.append({"job_id": text(job_id), "damaged": damage})
            elif raw:
                out.append(check_job_state({text(k): text(v) for k, v in raw.items()}))
        return out

    async def publish_heartbeat(self, worker: str, data: dict[str, Any], ttl: float) -> None:
        pipe = self._client.pipeline(transaction=False)
        pipe.set(self._keys.worker(worker), json.dumps(data), px=max(1, int(ttl * 1000)))
        pipe.sadd(self._keys.workers, worker)
        await pipe.execute()

    async def heartbeats(self) -> list[dict[str, Any]]:
        """Up to 1000 heartbeats. One that is not JSON, or not of the shape a
        worker or monitor publishes, comes back as ``aqw._damage.damaged_heartbeat``."""
        limit = 1000  # workers read at most: SSCAN, not SMEMBERS, so a forged set is cheap
        names: set[str] = set()
        cursor: Any = 0
        try:
            while True:
                cursor, batch = await self._client.sscan(self._keys.workers, cursor, count=limit)
                names.update(text(n) for n in batch)
                if not int(cursor) or len(names) >= limit:
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

    async def stats(self) -> dict[str, int]:
        """The counters of the stats hash (at most 1000 fields); a field that is not an
        integer is left out (``aqw status`` names it)."""
        out: dict[str, int] = {}
        cursor: Any = 0
        try:
            while True:
                reply: Any = await self._client.hscan(self._keys.stats, cursor, count=1000)
                cursor, batch = reply
                for k, v in batch.items():
                    n = to_int(v, None)
                    if n is not None:
                        out[text(k)] = n
                if not int(cursor) or len(out) >= 1000:
                    return out
        except ResponseError:  # WRONGTYPE: not a hash; `aqw status` reports it
            return out
