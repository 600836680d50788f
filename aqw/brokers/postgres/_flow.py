"""Rate limits and per-key caps of a PostgreSQL queue (``PgFlowLimits``, a shared
``FlowLimits`` part): the start of a job under limits is one call of the schema's function
``aqw_start_limited`` (migration ``0004_flow.sql``, which says each step): in one
transaction it checks the job's record, the lease, the GCRA bucket row (``aqw_rates``,
locked) and each cap (counted over ``aqw_slots`` joined to the holders' live leases), then
takes the lease, the fencing token, the bucket's turn and the slots, or refuses with
nothing taken (``aqw.RateLimited``). The limited starts made meanwhile go out as one
statement (``start_limited_many.sql``: the function once per start, in lock order, one
commit). A job without limits keeps the batched start (``start_many.sql``): it pays nothing
for them."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from typing import Any

import asyncpg

from ...errors import RateLimited
from ...flow import Limits, cap_wait, rate_wait
from ...record import UNFINISHED_KEEP
from ._batch import Batcher
from ._sql import statement

#: Seconds between two sweeps of idle rate buckets (run with ``promote_due``).
SWEEP_EVERY = 60.0

#: Idle buckets dropped per sweep.
SWEEP_BATCH = 1000


#: A limited start: job id, lease key, token, ttl in ms, what a missing record starts with,
#: the running fields, the rate bucket ('' none), its interval and tolerance in
#: microseconds, the caps (sorted (key, most) pairs).
LimitedStart = tuple[str, str, str, int, str, str, str, int, int, tuple[tuple[str, int], ...]]


def _result(row: Any) -> tuple[str, int | None, int]:
    fence = row["fence"]
    return str(row["status"]), None if fence is None else int(fence), int(row["wait"] or 0)


class PgFlowLimits:
    """The start step under limits, and the sweep of idle rate buckets."""

    shared = True
    options = frozenset({"rate_limit", "max_per_key"})

    def __init__(self, pool: Any, schema: str, queue: str) -> None:
        self._pool, self._s, self._queue = pool, schema, queue
        self._one = (
            f'SELECT status, fence, wait FROM "{schema}".aqw_start_limited'
            "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
        )
        self._many = statement("start_limited_many", schema)
        self._locks = (
            "SELECT count(pg_advisory_xact_lock(hashtext(k))) FROM unnest($1::text[]) AS k"
        )
        self._batch: Batcher[LimitedStart, tuple[str, int | None, int]] = Batcher(self._run)
        self._swept = 0.0

    async def start(
        self, limits: Limits, job_id: str, start: tuple[str, str, int, str, str]
    ) -> tuple[str, int | None]:
        """Start job ``job_id`` under ``limits`` (``start``: lease key, token, ttl in ms,
        what a missing record starts with, the running fields): (``"go"``, its fencing
        token), (``"held"``, None), (``"cancelled"`` or ``"ended"``, None); raises
        ``RateLimited`` when a limit refuses it. The limited starts made while one is on its
        way go out together (``_batch.py``): one statement, one commit."""
        caps = tuple(sorted(limits.caps))  # one lock order for every start
        call = (job_id, *start, limits.bucket or "", limits.interval_us, limits.tolerance_us, caps)
        status, fence, wait = await self._batch.submit(call)
        if status == "rate_limit":
            raise RateLimited(rate_wait(wait), reason="rate_limit")
        if status == "concurrency":
            raise RateLimited(cap_wait(wait, random.random()), reason="concurrency")
        return status, fence

    async def _run(self, calls: Sequence[LimitedStart]) -> list[tuple[str, int | None, int]]:
        """The calls in one transaction: every lock they take first, in the one order
        (buckets sorted, then caps sorted: ``0004_flow.sql``), then one statement calling
        the function for each; should two batches still wait on each other (two lock names
        of one hash: the server aborts one), that one's calls go again one by one."""
        until = time.time() + UNFINISHED_KEEP
        if len(calls) > 1:
            order = sorted(range(len(calls)), key=lambda i: (calls[i][6], calls[i][9]))
            ordered = [calls[i] for i in order]
            cols = list(zip(*ordered, strict=True))
            q = self._queue
            locks = sorted({f"aqw-rate:{q}:{b}" for b in cols[6] if b})
            locks += sorted({f"aqw-cap:{q}:{k}" for caps in cols[9] for k, _ in caps})
            await self._pool.connected()
            try:
                async with self._pool.acquire() as c, c.transaction():
                    await c.execute(self._locks, locks)  # every lock first, in one order
                    rows = await c.fetch(
                        self._many,
                        q,
                        *cols[:6],
                        until,
                        *cols[6:9],
                        [json.dumps([k for k, _ in caps]) for caps in cols[9]],
                        [json.dumps([n for _, n in caps]) for caps in cols[9]],
                    )
            except asyncpg.DeadlockDetectedError:  # two names of one lock hash (rare)
                return [(await self._run([c]))[0] for c in calls]
            by_n = {r["n"]: r for r in rows}
            out: list[tuple[str, int | None, int]] = [("held", None, 0)] * len(calls)
            for n, i in enumerate(order, start=1):
                out[i] = _result(by_n[n])
            return out
        (job_id, key, token, ms, new, fields, bucket, interval, tolerance, caps) = calls[0]
        row = await self._pool.fetchrow(
            self._one,
            self._queue,
            job_id,
            key,
            token,
            ms,
            new,
            fields,
            until,
            bucket,
            interval,
            tolerance,
            [k for k, _ in caps],
            [n for _, n in caps],
        )
        return [_result(row)]

    async def maybe_sweep(self) -> None:
        """Drop rate buckets whose times have both passed (an idle bucket holds nothing),
        every ``SWEEP_EVERY`` seconds."""
        now = time.monotonic()
        if now - self._swept < SWEEP_EVERY:
            return
        self._swept = now
        sql = (
            f'DELETE FROM "{self._s}".aqw_rates WHERE ctid = ANY(ARRAY('
            f'SELECT ctid FROM "{self._s}".aqw_rates WHERE greatest(tat, promised) < $1 '
            "LIMIT $2 FOR UPDATE SKIP LOCKED))"
        )
        await self._pool.execute(sql, int(time.time() * 1e6), SWEEP_BATCH)
