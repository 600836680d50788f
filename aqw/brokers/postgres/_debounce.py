"""Debounced enqueue on PostgreSQL (``PgDebounce``, a shared ``Debounce`` part): one call of
the schema's function ``aqw_debounce_publish`` (``0006_debounce.sql``), which, under the
key's advisory lock, replaces the key's waiting job (same id, its row never fetched) or
inserts a new one, and writes the job's record, in one transaction. The key's state is its
row of ``aqw_debounce``. A debounced job runs one of its key at a time (the implicit cap
``aqw.flow.debounce_cap``, enforced by the limited start, ``_flow.py``)."""

from __future__ import annotations

import json
import time
from typing import Any

from ...flow import DEBOUNCE_SLACK
from ...job import Job
from ...record import UNFINISHED_KEEP
from ._records import enqueued

_HEAD = '{"v":1,"id":'


def split_at_id(job: Job) -> tuple[bytes, str, bytes]:
    """``job``'s wire form cut around its id: (before, the id as written, after), so the
    function writes the form under the id of the job it replaces."""
    text = job.encode().decode("utf-8")
    if not text.startswith(_HEAD + '"'):  # the envelope opens with its version and id
        raise ValueError(f"unexpected job envelope for {job.id!r}")
    _, end = json.JSONDecoder().raw_decode(text, len(_HEAD))
    start = len(_HEAD) + 1
    return text[:start].encode(), text[start : end - 1], text[end - 1 :].encode()


#: Seconds between two sweeps of keys past their time (run with ``promote_due``).
SWEEP_EVERY = 60.0

#: Keys dropped per sweep.
SWEEP_BATCH = 1000


class PgDebounce:
    """Debounced enqueue on one queue, shared by every process."""

    shared = True

    def __init__(self, pool: Any, schema: str, queue: str, channel: str) -> None:
        self._pool, self._queue, self._channel = pool, queue, channel
        self._swept = 0.0
        self._sweep = (
            f'DELETE FROM "{schema}".aqw_debounce WHERE ctid = ANY(ARRAY('
            f'SELECT ctid FROM "{schema}".aqw_debounce WHERE until <= $1 '
            "LIMIT $2 FOR UPDATE SKIP LOCKED))"
        )
        self._sql = (
            f'SELECT job_id, replaced FROM "{schema}".aqw_debounce_publish'
            "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13::jsonb, $14)"
        )

    async def publish(
        self, job: Job, debounce: float, debounce_max: float | None
    ) -> tuple[str, bool]:
        assert job.key is not None
        before, wire_id, after = split_at_id(job)
        now = time.time()
        fields = enqueued(job, None, now)[0]
        row = await self._pool.fetchrow(
            self._sql,
            self._queue,
            job.key,
            now,
            float(debounce),
            float(debounce_max or 0.0),
            DEBOUNCE_SLACK,
            UNFINISHED_KEEP,
            job.id,
            wire_id,
            before,
            after,
            job.priority,
            fields,
            self._channel,
        )
        return str(row["job_id"]), bool(row["replaced"])

    async def maybe_sweep(self) -> None:
        """Drop the keys past their time (their job no longer replaced), every
        ``SWEEP_EVERY`` seconds."""
        now = time.monotonic()
        if now - self._swept >= SWEEP_EVERY:
            self._swept = now
            await self._pool.execute(self._sweep, time.time(), SWEEP_BATCH)
