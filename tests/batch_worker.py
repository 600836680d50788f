"""A worker process for tests/test_batch_crash.py:
``python tests/batch_worker.py QUEUE [PG_DSN COMPLETIONS EFFECTS]``.

Runs batch children (``child``: 5-20 ms, then a ledger entry), flow steps (``step``: one
more than its input, or than the sum of its inputs, and a ledger entry in
``<children>:steps``) and the batches' callback
(``done``: a ledger entry naming its batch and its own job id, and, with a PostgreSQL DSN,
one row in EFFECTS written under ``ctx.effect``) on the real Redis (AQW_TEST_REDIS_URL)
until SIGTERM. Ledger keys live under the queue's hash tag."""

from __future__ import annotations

import asyncio
import random
import sys
from typing import Any

import asyncpg
from _worker_script import REDIS_URL, run, serve
from redis.asyncio import Redis

import aqw
from aqw.idempotency import SqlCompletionStore

LEASE_TTL = 1.0


def ledger_keys(queue: str) -> tuple[str, str]:
    """(the children's runs, the callbacks' runs)."""
    tag = f"aqw:{{{queue}}}"
    return f"{tag}:ledger:children", f"{tag}:ledger:callbacks"


def make_app(
    queue: str,
    ledger: Redis | None = None,
    pool: Any = None,
    tables: tuple[str, str] = ("", ""),
    url: str = REDIS_URL,
) -> aqw.App:
    app = aqw.App(url, queue=queue, lease_ttl=LEASE_TTL)
    children, callbacks = ledger_keys(queue)

    @app.task(name="child")
    async def child(n: int, ctx: aqw.Context) -> None:
        assert ledger is not None, "this app only enqueues"
        await asyncio.sleep(random.uniform(0.005, 0.02))
        await ledger.rpush(children, ctx.job_id)

    @app.task(name="step", keep_result=True)
    async def step(x: int | dict[str, int] | list[int] | None, ctx: aqw.Context) -> int:
        """A flow's step: one more than its parent's result (or its parents' sum, or the
        sum of a batch step's children's results)."""
        assert ledger is not None, "this app only enqueues"
        await asyncio.sleep(random.uniform(0.005, 0.02))
        await ledger.rpush(children + ":steps", ctx.job_id)
        if isinstance(x, int):
            return x + 1
        return sum(x if isinstance(x, list) else (x or {}).values()) + 1

    @app.task(name="done")
    async def done(ctx: aqw.Context) -> None:
        assert ledger is not None and ctx.batch is not None
        await ledger.rpush(callbacks, f"{ctx.batch.id} {ctx.job_id} {ctx.batch.succeeded}")
        if pool is not None:  # the callback's effect, exactly once however often it runs
            store = SqlCompletionStore(tables[0])
            async with (
                pool.acquire() as conn,
                conn.transaction(),
                ctx.effect(conn, store) as first_time,
            ):
                if first_time:
                    await conn.execute(
                        f"INSERT INTO {tables[1]} (batch_id, job_id) VALUES ($1, $2)",
                        ctx.batch.id,
                        ctx.job_id,
                    )

    return app


async def main(queue: str, dsn: str = "", completions: str = "", effects: str = "") -> None:
    ledger = Redis.from_url(REDIS_URL)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4) if dsn else None
    try:
        app = make_app(queue, ledger, pool, (completions, effects))
        await serve(app, ledger, concurrency=8, grace=5.0)
    finally:
        if pool is not None:
            await pool.close()


if __name__ == "__main__":
    run(main(*sys.argv[1:5]))
