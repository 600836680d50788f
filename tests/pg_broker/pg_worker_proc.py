"""A worker process on the PostgreSQL broker for the kill test:

    python pg_worker_proc.py URL LEDGER SLEEP

Each job writes (n, 0) to LEDGER when it starts, sleeps SLEEP seconds, then writes
(n, attempt) when it finishes."""

from __future__ import annotations

import asyncio
import sys

import asyncpg

import aqw


async def main(url: str, ledger: str, sleep: float) -> None:
    app = aqw.App(url, lease_ttl=1.0)
    dsn = url.split("?")[0]
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)

    @app.task(name="slow")
    async def slow(n: int, ctx: aqw.Context) -> None:
        await pool.execute(f"INSERT INTO {ledger} VALUES ($1, 0)", n)
        await asyncio.sleep(sleep)
        await pool.execute(f"INSERT INTO {ledger} VALUES ($1, $2)", n, ctx.job.attempt)

    await app.worker(concurrency=10).run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
