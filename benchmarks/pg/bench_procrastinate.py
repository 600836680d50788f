"""The same measures on procrastinate (installed from PyPI into its own venv by run.sh),
stock settings but the worker's concurrency and its psycopg pool's size (20, as the
others'), in a database of its own.

    python bench_procrastinate.py DSN JOBS CONCURRENCY

Enqueue: JOBS jobs in batches of 500 (``batch_defer_async``), then 500 single awaited
``defer_async``. Drain: one worker (``wait=False``: it stops once the queue is empty).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from procrastinate import App, PsycopgConnector


async def main(dsn: str, jobs: int, concurrency: int) -> None:
    db = f"bench_pcr_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(dsn)
    await admin.execute(f'CREATE DATABASE "{db}"')
    own = urlunsplit(urlsplit(dsn)._replace(path=f"/{db}"))
    app = App(connector=PsycopgConnector(conninfo=own, min_size=2, max_size=20))
    done = 0

    @app.task(name="noop")
    async def noop(n: int) -> None:
        nonlocal done
        done += 1

    try:
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            t0 = time.perf_counter()
            for i in range(0, jobs, 500):
                await noop.batch_defer_async(*({"n": j} for j in range(i, min(i + 500, jobs))))
            bulk = jobs / (time.perf_counter() - t0)
            t0 = time.perf_counter()
            for i in range(500):
                await noop.defer_async(n=i)
            single = 500 / (time.perf_counter() - t0)
            t0 = time.perf_counter()
            await app.run_worker_async(
                concurrency=concurrency, wait=False, install_signal_handlers=False
            )
            drain = done / (time.perf_counter() - t0)
        print(
            json.dumps(
                {
                    "peer": "procrastinate",
                    "jobs": done,
                    "drain": round(drain),
                    "enqueue_bulk": round(bulk),
                    "enqueue_single": round(single),
                }
            )
        )
    finally:
        await admin.execute(f'DROP DATABASE "{db}" WITH (FORCE)')
        await admin.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
