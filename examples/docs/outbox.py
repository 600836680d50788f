"""The outbox: a job enqueued inside the caller's transaction runs if, and only if, the
transaction commits, and once.

Needs PostgreSQL (asyncpg): AQW_PG_DSN (default postgresql://postgres@127.0.0.1:5432/test).
"""

import asyncio
import contextlib
import os
import uuid

import asyncpg

import aqw

DSN = os.environ.get("AQW_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
SCHEMA = f"docs_outbox_{uuid.uuid4().hex[:8]}"

# Any broker with idempotency keys (Redis, Cluster, SQS with records=, memory); the outbox
# lives in the application's own database.
app = aqw.App("memory://", queue="shop", outbox=f"{DSN}?schema={SCHEMA}")
sent: list[int] = []
receipt_sent = asyncio.Event()


@app.task
async def send_receipt(order_id: int) -> None:
    sent.append(order_id)
    receipt_sent.set()


async def place_order(pool: asyncpg.Pool, order_id: int, fail: bool = False) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(f'INSERT INTO "{SCHEMA}".orders (id) VALUES ($1)', order_id)
        await send_receipt.enqueue(order_id, conn=conn)  # in this transaction
        if fail:
            raise RuntimeError("payment declined")  # the order and its job roll back


async def main() -> None:
    assert app.outbox is not None
    await app.outbox.migrate()  # or: aqw db migrate --app module:app (workers do it too)
    pool = await asyncpg.create_pool(DSN, min_size=1, max_size=2)
    try:
        await pool.execute(f'CREATE TABLE "{SCHEMA}".orders (id int PRIMARY KEY)')
        await place_order(pool, 1)
        with contextlib.suppress(RuntimeError):
            await place_order(pool, 2, fail=True)
        async with app.worker():  # every worker runs the relay; one of them leads
            await asyncio.wait_for(receipt_sent.wait(), 30)
        print("receipts sent:", sent)
        assert sent == [1]
        status = await app.outbox.status()
        print("not relayed:", status.pending)
        assert status.pending == 0  # the relay commits its batch before it stops
    finally:
        await pool.execute(f'DROP SCHEMA "{SCHEMA}" CASCADE')
        await pool.close()


asyncio.run(main())
