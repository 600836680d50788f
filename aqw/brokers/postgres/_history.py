"""The depth history and delayed page of a PostgreSQL queue (``PgDepthHistory``, a shared
``DepthHistory`` part): one sample per ``DEPTH_BUCKET`` seconds in ``aqw_depth``
(``0007_depth.sql``), written by the first heartbeat of each bucket in one statement
(``depth_sample.sql``: the queue counted only when the bucket has no sample; samples older
than ``DEPTH_KEEP`` trimmed in the same statement). The delayed page reads the queue's rows
due later, soonest first (no index of its own: a job pays nothing for the dashboard)."""

from __future__ import annotations

import logging
import time
from typing import Any

from ..messages import DEPTH_KEEP, DEPTH_SAMPLES, DelayedJob, DepthSample, bucket_of
from ._sql import statement

log = logging.getLogger("aqw.brokers.postgres")


class PgDepthHistory:
    """Depth samples of one queue in ``aqw_depth``, and its delayed page."""

    shared = True

    def __init__(self, pool: Any, schema: str, queue: str) -> None:
        self._pool, self._s, self._queue = pool, schema, queue
        self._last = -1  # the last bucket known to have its sample

    async def sample(self, at: float) -> None:
        bucket = bucket_of(at)
        if bucket == self._last:
            return
        try:
            sql = statement("depth_sample", self._s)
            await self._pool.execute(sql, self._queue, bucket, time.time(), bucket - DEPTH_KEEP)
            self._last = bucket
        except Exception as exc:  # a heartbeat must not fail for a chart
            log.warning("postgresql: the depth sample of queue %s failed: %r", self._queue, exc)

    async def since(self, at: float) -> list[DepthSample]:
        sql = (
            f'SELECT * FROM (SELECT bucket, waiting, in_flight, delayed, dead FROM "{self._s}"'
            ".aqw_depth WHERE queue = $1 AND bucket >= $2 ORDER BY bucket DESC LIMIT $3) AS s "
            "ORDER BY bucket"
        )
        rows = await self._pool.fetch(sql, self._queue, at, DEPTH_SAMPLES)
        return [
            DepthSample(float(r["bucket"]), r["waiting"], r["in_flight"], r["delayed"], r["dead"])
            for r in rows
        ]

    async def delayed_page(self, start: int, count: int) -> list[DelayedJob]:
        sql = (
            f'SELECT job, run_at FROM "{self._s}".aqw_jobs WHERE queue = $1 '
            "AND consumer IS NULL AND run_at > $2 ORDER BY run_at, id OFFSET $3 LIMIT $4"
        )
        rows = await self._pool.fetch(sql, self._queue, time.time(), max(0, start), count)
        return [DelayedJob(float(r["run_at"]), bytes(r["job"])) for r in rows]
