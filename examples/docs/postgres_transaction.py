"""The handler's writes and the job's ack in one transaction: ``ctx.transaction()`` on the
PostgreSQL broker. Both commit together, or neither does.

Needs PostgreSQL (asyncpg): AQW_PG_DSN (default postgresql://postgres@127.0.0.1:5432/test).
"""

import asyncio
import os
import uuid

import asyncpg

import aqw

DSN = os.environ.get("AQW_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
SCHEMA = f"docs_pgtx_{uuid.uuid4().hex[:8]}"

app = aqw.App(f"{DSN}?schema={SCHEMA}", queue="orders")


@app.task
async def ship(order_id: int, ctx: aqw.Context) -> None:
    async with ctx.transaction() as conn:  # a connection of the broker's pool
        await conn.execute(f'UPDATE "{SCHEMA}".orders SET shipped = true WHERE id = $1', order_id)
    # The block's commit acked the job: its record reads succeeded already.


async def main() -> None:
    conn = await asyncpg.connect(DSN)
    try:
        await conn.execute(f'CREATE SCHEMA "{SCHEMA}"')
        await conn.execute(f'CREATE TABLE "{SCHEMA}".orders (id int PRIMARY KEY, shipped bool)')
        await conn.execute(f'INSERT INTO "{SCHEMA}".orders VALUES (1, false), (2, false)')
        ids = [await ship.enqueue(n) for n in (1, 2)]
        await app.worker(burst=True).run()
        shipped = await conn.fetch(f'SELECT id FROM "{SCHEMA}".orders WHERE shipped ORDER BY id')
        print("shipped:", [r["id"] for r in shipped])
        print("states:", [(await app.job(i)).state for i in ids])  # type: ignore[union-attr]
    finally:
        await app.close()
        await conn.execute(f'DROP SCHEMA "{SCHEMA}" CASCADE')
        await conn.close()


asyncio.run(main())
