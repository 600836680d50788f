"""``RedisBatchCounts``: batches (``aqw.brokers.batching``) on Redis, every key in the queue's
slot: ``aqw:{q}:batch:<id>`` (its state, counts, options and callbacks' jobs),
``...:todo`` (the children not final yet) and ``...:children`` (in the order added).

Opening, adding and sealing are scripts of their own (``batch_open.lua``, ``batch_add.lua``,
``batch_seal.lua``); the counting is in the settle scripts (``ack.lua``, ``dead_letter.lua``)
through ``batch_lib.lua``: a child's record names its batch, and the step that settles it
counts it, once, by its membership in the todo set. A job of no batch runs none of it.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from ..._redis import scripts
from ..._redis.keys import QueueKeys
from ..._redis.scripts import ms
from ...errors import ConfigError
from ...job import Job
from ...record import UNFINISHED_KEEP
from ..batching import BATCH_HEADER, CALLBACK_KINDS, BatchInfo, BatchSpec
from ._entries import text
from ._priorities import RedisLevels

#: Children enqueued per call of ``batch_add.lua`` (a call's values go on Lua's stack).
ADD_CHUNK = 1000


class RedisBatchCounts:
    """The ``BatchCounts`` part of a ``RedisBroker`` (shared)."""

    shared = True

    def __init__(self, client: Redis, keys: QueueKeys, levels: RedisLevels) -> None:
        self.client = client
        self.keys = keys
        self.levels = levels
        self.prefix = keys.tag + ":"
        self._open = scripts.load("batch_open")
        self._add = scripts.load("batch_add")
        self._seal = scripts.load("batch_seal")

    def key(self, batch_id: str) -> str:
        return f"{self.prefix}batch:{batch_id}"

    async def _run(self, script: scripts.Script, batch_id: str, argv: list[Any]) -> Any:
        try:
            return await script(self.client, [self.key(batch_id)], [self.prefix, batch_id, *argv])
        except ResponseError as exc:
            message = str(exc)
            if "aqw batch" not in message:
                raise
            raise ConfigError(message.partition("aqw ")[2].partition(" script:")[0]) from None

    async def open(self, spec: BatchSpec) -> None:
        argv: list[Any] = [
            "1" if spec.fail_fast else "0",
            ms(spec.keep_for),
            ms(spec.key_ttl),
            spec.parent or "",
            ms(UNFINISHED_KEEP),
            "1" if spec.sealed else "0",
            " ".join(spec.inputs),
            spec.data,
            len(spec.members),
            *spec.members,
        ]
        for kind, job in spec.callbacks.items():
            argv += (kind, job.encode(), job.id, job.task, self.keys.stream_for(job.priority))
            argv += (repr(job.enqueued_at), job.headers.get(BATCH_HEADER, ""))
        levels = {job.priority for job in spec.callbacks.values() if job.priority}
        if levels:
            await self.levels.announce(levels)
        await self._run(self._open, spec.id, argv)

    async def add(self, batch_id: str, jobs: list[Job]) -> None:
        """In calls of ``ADD_CHUNK`` jobs, one after the other (a later call's refusal, the
        batch sealed meanwhile, leaves the earlier calls' children in it)."""
        for start in range(0, max(1, len(jobs)), ADD_CHUNK):  # none: still checked open
            chunk = jobs[start : start + ADD_CHUNK]
            argv: list[Any] = [ms(UNFINISHED_KEEP)]
            for job in chunk:
                argv += (job.encode(), job.id, job.task, repr(job.enqueued_at))
                argv += (
                    self.keys.stream_for(job.priority),
                    job.headers.get(BATCH_HEADER, batch_id),
                )
            await self.levels.around(chunk, self._run(self._add, batch_id, argv))

    async def seal(self, batch_id: str) -> BatchInfo:
        if not await self._run(self._seal, batch_id, ["0"]):
            raise ConfigError(f"batch {batch_id!r}: no such batch (unknown id, or expired)")
        info = await self.info(batch_id)
        assert info is not None
        return info

    async def cancel(self, batch_id: str) -> BatchInfo | None:
        if not await self._run(self._seal, batch_id, ["1"]):
            return None
        return await self.info(batch_id)

    async def info(self, batch_id: str) -> BatchInfo | None:
        key = self.key(batch_id)
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.hgetall(key)
            pipe.scard(key + ":todo")
            raw, pending = await pipe.execute()
        if not raw:
            return None
        fields = {text(k): text(v) for k, v in raw.items()}
        callbacks = {
            kind: fields[f"fired:{kind}"] for kind in CALLBACK_KINDS if f"fired:{kind}" in fields
        }
        return BatchInfo.from_fields(batch_id, fields, int(pending), callbacks)

    async def children(self, batch_id: str, start: int, count: int) -> list[str]:
        if count <= 0:
            return []
        start = max(0, start)
        raw = await self.client.lrange(self.key(batch_id) + ":children", start, start + count - 1)
        return [text(v) for v in raw]
