"""The same measures on pgqueuer (installed from PyPI into its own venv by run.sh), stock
settings but the batch size and concurrency, in a database of its own.

    python bench_pgqueuer.py DSN JOBS CONCURRENCY
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from pgqueuer import AsyncpgPoolDriver, PgQueuer, Queries
from pgqueuer.types import QueueExecutionMode


async def main(dsn: str, jobs: int, concurrency: int) -> None:
    db = f"bench_pgq_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(dsn)
    await admin.execute(f'CREATE DATABASE "{db}"')
    own = urlunsplit(urlsplit(dsn)._replace(path=f"/{db}"))
    pool = await asyncpg.create_pool(own, min_size=2, max_size=20)
    try:
        driver = AsyncpgPoolDriver(pool)
        queries = Queries(driver)
        await queries.install()
        pgq = PgQueuer(driver)
        done = 0

        @pgq.entrypoint("noop")
        async def noop(job: object) -> None:
            nonlocal done
            done += 1

        t0 = time.perf_counter()
        for i in range(0, jobs, 500):
            n = min(500, jobs - i)
            await queries.enqueue(["noop"] * n, [str(j).encode() for j in range(i, i + n)], [0] * n)
        bulk = jobs / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for i in range(500):
            await queries.enqueue("noop", str(i).encode(), 0)
        single = 500 / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        await pgq.run(
            mode=QueueExecutionMode.drain,
            batch_size=100,
            max_concurrent_tasks=max(concurrency, 200),
        )
        drain = done / (time.perf_counter() - t0)
        print(
            json.dumps(
                {
                    "peer": "pgqueuer",
                    "jobs": done,
                    "drain": round(drain),
                    "enqueue_bulk": round(bulk),
                    "enqueue_single": round(single),
                }
            )
        )
    finally:
        await pool.close()
        await admin.execute(f'DROP DATABASE "{db}" WITH (FORCE)')
        await admin.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
