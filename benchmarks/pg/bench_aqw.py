"""Drain and enqueue of no-op jobs on aqw's PostgreSQL broker: one JSON line.

    python bench_aqw.py DSN JOBS CONCURRENCY

Enqueue: JOBS jobs in batches of 500 (``enqueue_many``), then 500 single awaited enqueues.
Drain: one worker (lease and fencing token per job, as always) until the queue is empty.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid

import asyncpg

import aqw


async def main(dsn: str, jobs: int, concurrency: int) -> None:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    app = aqw.App(f"{dsn}?schema={schema}&pool=20", queue="bench")
    done = 0

    @app.task(name="noop")
    async def noop(n: int) -> None:
        nonlocal done
        done += 1

    try:
        await app.broker.connect()
        t0 = time.perf_counter()
        for i in range(0, jobs, 500):
            await noop.enqueue_many(list(range(i, min(i + 500, jobs))))
        bulk = jobs / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for i in range(500):
            await noop.enqueue(i)
        single = 500 / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        await app.worker(
            concurrency=concurrency, prefetch=int(os.environ.get("AQW_PREFETCH", "0")), burst=True
        ).run()
        drain = done / (time.perf_counter() - t0)
        print(
            json.dumps(
                {
                    "peer": "aqw-postgresql",
                    "jobs": done,
                    "drain": round(drain),
                    "enqueue_bulk": round(bulk),
                    "enqueue_single": round(single),
                }
            )
        )
    finally:
        await app.close()
        conn = await asyncpg.connect(dsn)
        await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await conn.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
