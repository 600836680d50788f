"""Pause, the waiting list, delete and promote of a queue on Redis (``RedisQueueControl``, a
shared ``QueueControl`` part). The pause is one key, ``aqw:{q}:paused``, that workers read
about once a second; the waiting jobs of a level are its stream's entries after its consumer
group's last delivered id."""

from __future__ import annotations

import json
import time
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from ..._redis import scripts
from ..._redis.keys import GROUP, QueueKeys
from ..messages import WaitingJob
from ._entries import text
from ._priorities import RedisLevels

#: Most soonest-due members of each delayed set that ``promote`` looks at.
PROMOTE_SCAN = 10_000
#: Most entries of each stream and delayed set that ``find`` looks at.
FIND_SCAN = 5_000


def paused_key(keys: QueueKeys) -> str:
    return f"{keys.tag}:paused"


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return 0, 0


class RedisQueueControl:
    """The operator's controls of one queue (``RedisBroker.control``)."""

    shared = True

    def __init__(self, client: Redis, keys: QueueKeys, levels: RedisLevels) -> None:
        self._client = client
        self._keys = keys
        self._levels = levels
        self._delete = scripts.load("waiting_delete")
        self._promote = scripts.load("delayed_promote")
        self._find = scripts.load("job_find")

    async def pause(self) -> bool:
        return bool(await self._client.set(paused_key(self._keys), str(time.time()), nx=True))

    async def resume(self) -> bool:
        return bool(await self._client.delete(paused_key(self._keys)))

    async def paused(self) -> bool:
        return bool(await self._client.exists(paused_key(self._keys)))

    async def _active(self) -> list[int]:
        await self._levels.refresh()
        return sorted(self._levels.active)

    async def waiting_counts(self) -> dict[int, int]:
        levels = await self._active()
        pipe = self._client.pipeline(transaction=False)
        for level in levels:
            pipe.xlen(self._keys.stream_for(level))
            pipe.xpending(self._keys.stream_for(level), GROUP)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        counts = {}
        for i, level in enumerate(levels):
            length, pending = replies[2 * i : 2 * i + 2]
            if isinstance(length, Exception):
                continue
            busy = 0 if isinstance(pending, Exception) else int(pending["pending"])
            counts[level] = max(0, int(length) - busy)
        counts.setdefault(0, 0)
        return counts

    async def _last_delivered(self, stream: str) -> str:
        try:
            groups: Any = await self._client.xinfo_groups(stream)
        except ResponseError:  # no stream, or not a stream: nothing waits in it
            return ""
        for group in groups:
            if text(group.get("name", "")) == GROUP:
                return text(group.get("last-delivered-id", "0-0"))
        return "0-0"

    async def waiting_page(self, level: int, after: str | None, count: int) -> list[WaitingJob]:
        stream = self._keys.stream_for(level)
        last = await self._last_delivered(stream)
        if not last:
            return []
        start = max(last, after or "0-0", key=_id_key)
        try:
            raw: Any = await self._client.xrange(stream, f"({start}", "+", count=count)
        except ResponseError:
            return []
        out = []
        for entry_id, fields in raw:
            data = fields.get(b"j")
            if data is None:
                data = repr({text(k): v for k, v in fields.items()}).encode()
            out.append(WaitingJob(text(entry_id), level, data))
        return out

    async def delete_waiting(self, level: int, entry_id: str) -> bool:
        stream = self._keys.stream_for(level)
        done: Any = await self._delete(self._client, [stream], [entry_id, GROUP])
        return int(done) == 1

    async def promote(self, job_id: str) -> bool:
        levels = await self._active()
        keys = [self._keys.delayed_for(level) for level in reversed(levels)]
        needle = _needle(job_id)
        now_ms = int(time.time() * 1000)
        done: Any = await self._promote(self._client, keys, [needle, now_ms, PROMOTE_SCAN])
        return int(done) == 1

    async def find(self, job_id: str) -> bytes | None:
        levels = sorted(await self._active(), reverse=True)
        streams = [self._keys.stream_for(level) for level in levels]
        delayed = [self._keys.delayed_for(level) for level in levels]
        argv = [_needle(job_id), FIND_SCAN, len(streams)]
        found: Any = await self._find(self._client, [*streams, *delayed], argv)
        if not found:
            return None
        return found if isinstance(found, bytes) else str(found).encode()


def _needle(job_id: str) -> str:
    """What a job's wire form holds for its id (compact JSON)."""
    return '"id":' + json.dumps(job_id, ensure_ascii=False, separators=(",", ":"))
