"""Limits changed at run time on PostgreSQL (``PgRunLimits``, a shared ``RunLimits`` part):
rows of ``aqw_limits`` (``0005_run_limits.sql``), one per name of the map
``aqw.brokers.parts.RunLimits`` describes, cached by each worker (``OverrideCache``: read at
its start, then every ``REFRESH_EVERY`` seconds once a limited job has started)."""

from __future__ import annotations

from typing import Any

from ..local import StoredRunLimits

#: Most rows read back (a map this big was not written by aqw).
MOST_ROWS = 10_000


class PgRunLimits(StoredRunLimits):
    def __init__(self, pool: Any, schema: str, queue: str) -> None:
        self._pool, self._s, self._queue = pool, schema, queue
        super().__init__()

    async def read(self) -> dict[str, str]:
        sql = f'SELECT name, value FROM "{self._s}".aqw_limits WHERE queue = $1 LIMIT $2'
        rows = await self._pool.fetch(sql, self._queue, MOST_ROWS)
        return {r["name"]: r["value"] for r in rows}

    async def write(self, name: str, value: str | None) -> None:
        if value is None:
            sql = f'DELETE FROM "{self._s}".aqw_limits WHERE queue = $1 AND name = $2'
            await self._pool.execute(sql, self._queue, name)
            return
        sql = (
            f'INSERT INTO "{self._s}".aqw_limits (queue, name, value) VALUES ($1, $2, $3) '
            "ON CONFLICT (queue, name) DO UPDATE SET value = EXCLUDED.value"
        )
        await self._pool.execute(sql, self._queue, name, value)
