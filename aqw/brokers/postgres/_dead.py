"""The dead-letter queue of a PostgreSQL queue: rows of ``aqw_dead``, by id (oldest first)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from ...job import Job
from ..messages import DeadJob
from ._records import enqueued
from ._sql import statement

#: A replayed job's record keeps its story (attempts, last error) but not its end.
REPLAYED = {"run_at": "", "finished_at": "", "dlq_entry": "", "cancel": "", "state": "queued"}


class DeadLetters:
    """List, read, replay and delete the dead jobs of one queue."""

    def __init__(self, pool: Any, schema: str, queue: str, channel: str) -> None:
        self._pool = pool
        self._s = schema
        self._queue = queue
        self._channel = channel

    async def page(self, count: int, after: str | None) -> list[DeadJob]:
        start = _entry(after) if after is not None else 0
        rows = await self._pool.fetch(
            statement("dead_list", self._s), self._queue, start or 0, count
        )
        return [_dead(r) for r in rows]

    async def get(self, entry_id: str) -> DeadJob | None:
        n = _entry(entry_id)
        if n is None:
            return None
        sql = f'SELECT * FROM "{self._s}".aqw_dead WHERE queue = $1 AND id = $2'
        row = await self._pool.fetchrow(sql, self._queue, n)
        return None if row is None else _dead(row)

    async def replay(self, entries: Sequence[tuple[str, Job]]) -> list[Job]:
        """Back on the queue and out of the DLQ, in one transaction: the jobs replayed."""
        replayed = []
        delete = f'DELETE FROM "{self._s}".aqw_dead WHERE queue = $1 AND id = $2 RETURNING 1'
        publish = statement("publish", self._s)
        await self._pool.connected()
        async with self._pool.acquire() as c, c.transaction():
            for entry_id, job in entries:
                n = _entry(entry_id)
                if n is None or await c.fetchval(delete, self._queue, n) is None:
                    continue
                q, wire, level = self._queue, [job.encode()], [job.priority]
                await c.execute(publish, q, wire, level, 0.0, self._channel, [], [], [])
                put = statement("record_put", self._s)
                start, until = enqueued(job, None, time.time())
                await c.execute(put, q, job.id, start, json.dumps(REPLAYED), until)
                replayed.append(job)
        return replayed

    async def delete(self, entry_ids: Sequence[str]) -> int:
        ids = [n for n in (_entry(i) for i in entry_ids) if n is not None]
        sql = (
            f'DELETE FROM "{self._s}".aqw_dead '
            "WHERE queue = $1 AND id = ANY($2::bigint[]) RETURNING 1"
        )
        return len(await self._pool.fetch(sql, self._queue, ids))


def _entry(entry_id: str) -> int | None:
    try:
        return int(entry_id)
    except ValueError:
        return None


def _dead(r: Any) -> DeadJob:
    return DeadJob(
        id=str(r["id"]),
        data=bytes(r["data"]),
        task=r["task"],
        error_type=r["error_type"],
        error=r["error"],
        traceback=r["traceback"],
        attempts=r["attempts"],
        first_failed_at=r["first_failed_at"],
        last_failed_at=r["last_failed_at"],
        worker=r["worker"],
        job_id=r["job_id"],
    )
