"""The drain of aqw's PostgreSQL broker with and without a session held ``idle in
transaction`` (it holds the xmin horizon back: no dead row can be vacuumed meanwhile).

    python idle_in_transaction.py DSN JOBS ROUNDS

Each round drains JOBS no-op jobs twice, plain and with the idle session opened before the
enqueue (so every row the drain deletes stays as a dead tuple), interleaved; one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
import uuid

import asyncpg

import aqw


async def drain(dsn: str, jobs: int, hold: bool) -> float:
    schema = f"bench_idle_{uuid.uuid4().hex[:8]}"
    app = aqw.App(f"{dsn}?schema={schema}&pool=20", queue="bench")

    @app.task(name="noop")
    async def noop(n: int) -> None: ...

    idle = await asyncpg.connect(dsn)
    try:
        await app.broker.connect()
        if hold:  # a transaction with a snapshot, left open: "idle in transaction"
            await idle.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            await idle.fetchval("SELECT count(*) FROM pg_class")
        for i in range(0, jobs, 500):
            await noop.enqueue_many(list(range(i, min(i + 500, jobs))))
        t0 = time.perf_counter()
        await app.worker(concurrency=100, burst=True).run()
        return jobs / (time.perf_counter() - t0)
    finally:
        await idle.close()
        await app.close()
        conn = await asyncpg.connect(dsn)
        await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await conn.close()


async def main(dsn: str, jobs: int, rounds: int) -> None:
    plain, held = [], []
    for _ in range(rounds):
        plain.append(await drain(dsn, jobs, False))
        held.append(await drain(dsn, jobs, True))
    p, h = statistics.median(plain), statistics.median(held)
    print(
        json.dumps(
            {
                "jobs": jobs,
                "drain_plain": round(p),
                "drain_idle_in_transaction": round(h),
                "ratio": round(h / p, 2),
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
