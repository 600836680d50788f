"""The parts of a PostgreSQL queue shared across processes: schedule marks (only forward)
and worker heartbeats (expiring on the server's clock)."""

from __future__ import annotations

import json
from typing import Any

from ..._readback import damaged_heartbeat
from ..messages import ScheduleMark
from ._sql import statement


class PgScheduleMarks:
    """``ScheduleMarks`` in ``aqw_marks``: a mark moves forward only, in one statement."""

    shared = True

    def __init__(self, pool: Any, schema: str, queue: str) -> None:
        self._pool, self._s, self._queue = pool, schema, queue

    async def read(self) -> dict[str, ScheduleMark]:
        sql = f'SELECT task, tick, job_id FROM "{self._s}".aqw_marks WHERE queue = $1'
        rows = await self._pool.fetch(sql, self._queue)
        return {r["task"]: ScheduleMark(r["tick"], r["job_id"]) for r in rows}

    async def advance(self, task: str, mark: ScheduleMark) -> None:
        sql = statement("mark_advance", self._s)
        await self._pool.execute(sql, self._queue, task, mark.tick, mark.job_id)


class PgWorkerStatus:
    """``WorkerStatus`` in ``aqw_heartbeats``."""

    shared = True

    def __init__(self, pool: Any, schema: str, queue: str) -> None:
        self._pool, self._s, self._queue = pool, schema, queue

    async def publish_heartbeat(self, worker: str, data: dict[str, Any], ttl: float) -> None:
        sql = statement("heartbeat_put", self._s)
        await self._pool.execute(sql, self._queue, worker, json.dumps(data), ttl)

    async def heartbeats(self) -> list[dict[str, Any]]:
        rows = await self._pool.fetch(statement("heartbeats", self._s), self._queue)
        out = []
        for r in rows:
            try:
                beat = json.loads(r["data"])
            except ValueError as exc:
                beat = damaged_heartbeat(r["worker"], f"not JSON ({exc})")
            if not isinstance(beat, dict):
                beat = damaged_heartbeat(r["worker"], "not a JSON object")
            out.append(beat)
        return out

    async def remove_heartbeat(self, worker: str) -> None:
        sql = f'DELETE FROM "{self._s}".aqw_heartbeats WHERE queue = $1 AND worker = $2'
        await self._pool.execute(sql, self._queue, worker)
