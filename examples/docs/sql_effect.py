"""ctx.effect: a job's write to PostgreSQL commits once, even if the job runs twice.

The broker's completion record is written at the ack, after the handler's own transaction
committed; a worker that dies between the two leaves a job that runs again. Recording
"this effect happened" in the same transaction as the effect closes that gap.

Needs PostgreSQL (asyncpg): AQW_PG_DSN (default postgresql://postgres@127.0.0.1:5432/test).
"""

import asyncio
import os
import uuid

import asyncpg

import aqw
from aqw.idempotency import SqlCompletionStore

DSN = os.environ.get("AQW_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
suffix = uuid.uuid4().hex[:8]
store = SqlCompletionStore(f"docs_{suffix}_completions")  # + docs_<suffix>_fences
CHARGES = f"docs_{suffix}_charges"

app = aqw.App("memory://", queue="billing")
pool: asyncpg.Pool


@app.task
async def charge(order_id: int, cents: int, ctx: aqw.Context) -> None:
    # One effect per order, whichever job (or redelivery) gets here first. The completion
    # row is written in the same transaction as the effect: both commit, or neither.
    async with (
        pool.acquire() as conn,
        conn.transaction(),
        ctx.effect(conn, store, key=f"charge:{order_id}") as first_time,
    ):
        if first_time:
            await conn.execute(
                f"INSERT INTO {CHARGES} (order_id, cents) VALUES ($1, $2)", order_id, cents
            )
        else:
            ctx.log.info("order %s was already charged", order_id)


async def main() -> None:
    global pool
    pool = await asyncpg.create_pool(DSN, min_size=1, max_size=4)
    async with pool.acquire() as conn:
        await store.ensure_schema(conn)  # once, at start-up
        await conn.execute(f"CREATE TABLE {CHARGES} (order_id int, cents int)")
    try:
        await charge.enqueue({"order_id": 7, "cents": 1999})
        await charge.enqueue({"order_id": 7, "cents": 1999})  # a second job, same effect
        await app.worker(burst=True).run()
        async with pool.acquire() as conn:
            rows = await conn.fetch(f"SELECT order_id, cents FROM {CHARGES}")
            done = await store.completion(conn, queue=app.queue, key="charge:7")
        print("charges:", [tuple(r) for r in rows], "completed by job", done and done["job_id"])
        assert len(rows) == 1
    finally:
        async with pool.acquire() as conn:
            await store.drop_schema(conn)
            await conn.execute(f"DROP TABLE IF EXISTS {CHARGES}")
        await pool.close()
        await app.close()


if __name__ == "__main__":
    asyncio.run(main())
