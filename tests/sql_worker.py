"""A worker that commits each job's SQL effect and then hangs before the ack, for the test to
SIGKILL: the crash between commit and ack that only a SQL completion record can absorb.

Usage: python tests/sql_worker.py REDIS_URL QUEUE PG_DSN TABLE EFFECTS_TABLE LEASE_TTL

Prints ``ready`` once consuming, then ``committed <job id>`` after each commit.
"""

from __future__ import annotations

import asyncio
import sys

import asyncpg

import aqw
from aqw.brokers.redis import RedisBroker
from aqw.idempotency import SqlCompletionStore, context_effect


async def main(
    redis_url: str, queue: str, dsn: str, table: str, effects: str, lease_ttl: float
) -> None:
    store = SqlCompletionStore(table)
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=10)
    app = aqw.App(RedisBroker(redis_url, queue), lease_ttl=lease_ttl)
    hang = asyncio.Event()

    @app.task(name="charge")
    async def charge(n: int, ctx: aqw.Context) -> None:
        async with (
            pool.acquire() as conn,
            conn.transaction(),
            context_effect(ctx, conn, store) as first_time,
        ):
            if first_time:
                await conn.execute(
                    f"INSERT INTO {effects} (job_id, key, writer) VALUES ($1, $2, 'crasher')",
                    ctx.job.id,
                    ctx.job.key,
                )
        print(f"committed {ctx.job.id}", flush=True)
        await hang.wait()  # "crash" here: committed, never acknowledged

    async with app.worker(concurrency=500):
        print("ready", flush=True)
        await hang.wait()


if __name__ == "__main__":
    url, q, pg, tbl, eff, ttl = sys.argv[1:7]
    asyncio.run(main(url, q, pg, tbl, eff, float(ttl)))
