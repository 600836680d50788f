"""A worker process on the PostgreSQL broker for the restart test:

    python pg_restart_proc.py URL EFFECTS SLEEP

Each job ``n`` sleeps SLEEP seconds (every 25th 30 times as long), then writes its effect,
a row ``n`` in EFFECTS, once: guarded by ``ctx.effect`` (the completion row commits in the
effect's transaction)."""

from __future__ import annotations

import asyncio
import sys

import asyncpg

import aqw
from aqw.idempotency import SqlCompletionStore


async def main(url: str, effects: str, sleep: float) -> None:
    app = aqw.App(url, lease_ttl=2.0)
    store = SqlCompletionStore(f"{effects}_completions")
    pool = await asyncpg.create_pool(url.split("?")[0], min_size=1, max_size=12)

    @app.task(name="effect")
    async def effect(n: int, ctx: aqw.Context) -> None:
        # Every 25th job outlives its lease's renewal interval: the restart cuts renewals too.
        await asyncio.sleep(sleep * 30 if n % 25 == 0 else sleep)
        async with (
            pool.acquire() as conn,
            conn.transaction(),
            ctx.effect(conn, store, key=f"n:{n}") as first_time,
        ):
            if first_time:
                await conn.execute(f"INSERT INTO {effects} VALUES ($1)", n)

    await app.worker(concurrency=10).run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
