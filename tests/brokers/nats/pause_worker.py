"""A worker process for the late-ack test (``test_late_ack.py``): queue ``argv[2]`` on
``argv[1]``, named ``argv[3]``, writing its steps to the file ``argv[4]`` and its fenced
effect to the PostgreSQL tables ``argv[5]`` (``<table>`` and ``<table>_applied``). On
SIGUSR1 it prints its broker's counters as one JSON line."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import asyncpg

import aqw

DSN = "postgresql://postgres@127.0.0.1:5432/test"


def register(app: aqw.App, name: str, steps: Path, table: str) -> None:
    @app.task(name="pay", max_retries=0)
    async def pay(n: int, ctx: aqw.Context) -> None:
        with steps.open("a") as f:
            f.write(f"start {name} {ctx.fencing_token}\n")
        await asyncio.sleep(1.5)
        conn = await asyncpg.connect(DSN)
        try:
            async with conn.transaction():
                row = await conn.fetchrow(
                    f"INSERT INTO {table} (job_id, fence, worker) VALUES ($1, $2, $3) "
                    f"ON CONFLICT (job_id) DO UPDATE SET fence = EXCLUDED.fence, "
                    f"worker = EXCLUDED.worker WHERE {table}.fence < EXCLUDED.fence "
                    "RETURNING worker",
                    ctx.job_id,
                    ctx.fencing_token,
                    name,
                )
                if row is not None:
                    await conn.execute(
                        f"INSERT INTO {table}_applied (job_id, worker) VALUES ($1, $2)",
                        ctx.job_id,
                        name,
                    )
        finally:
            await conn.close()
        with steps.open("a") as f:
            f.write(f"write {name} {row is not None}\n")


async def main() -> None:
    url, queue, name, steps, table = sys.argv[1:6]
    app = aqw.App(f"{url}?queue={queue}&ack_wait=2", lease_ttl=2.0)
    register(app, name, Path(steps), table)
    worker = app.worker(concurrency=1, grace=0.5)

    async def report() -> None:
        print(json.dumps(await app.broker.stats()), flush=True)

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, lambda: loop.create_task(report()))
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main())
