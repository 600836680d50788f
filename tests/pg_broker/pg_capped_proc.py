"""A worker process on the PostgreSQL broker for the shared-cap test:

    python pg_capped_proc.py URL LEDGER

Task ``capped`` (one job per ``key`` at a time, ``max_per_key=1``) writes a row of LEDGER
with the server's clock when its handler starts, and its end when it returns (both inside
the job's lease)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import asyncpg

import aqw


async def main(url: str, ledger: str) -> None:
    app = aqw.App(url)
    pool = await asyncpg.create_pool(url.split("?")[0], min_size=1, max_size=4)

    @app.task(name="capped", concurrency_key=lambda p: p["key"], max_per_key=1)
    async def capped(p: dict[str, Any], ctx: aqw.Context) -> None:
        row = await pool.fetchval(
            f"INSERT INTO {ledger} (key, n, attempt, started) "
            "VALUES ($1, $2, $3, clock_timestamp()) RETURNING id",
            p["key"],
            p["n"],
            ctx.job.attempt,
        )
        await asyncio.sleep(0.02)
        await pool.execute(f"UPDATE {ledger} SET ended = clock_timestamp() WHERE id = $1", row)

    await app.worker(concurrency=8).run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
