"""A worker process for the chaos test (``test_chaos.py``): queue ``argv[2]`` on ``argv[1]``;
each job's effect is one row of the PostgreSQL table ``argv[3]``, written under
``ctx.effect`` (a completion record and a fence in the same transaction), so a job that runs
again after a crash or a lost lease writes nothing the second time."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import sys

import asyncpg

import aqw
from aqw.idempotency import SqlCompletionStore

DSN = "postgresql://postgres@127.0.0.1:5432/test"


async def main() -> None:
    if os.environ.get("AQW_CHAOS_LOG"):  # what each worker did, timed (the drain figures)
        logging.basicConfig(level=logging.INFO, format="%(created).3f %(process)d %(message)s")
    url, queue, table = sys.argv[1:4]
    extra = sys.argv[4] if len(sys.argv) > 4 else ""  # more URL options, e.g. "&replicas=3"
    pool = await asyncpg.create_pool(DSN, min_size=1, max_size=10)
    store = SqlCompletionStore()
    app = aqw.App(f"{url}?queue={queue}&ack_wait=3{extra}", lease_ttl=3.0)

    ran = False

    @app.task(name="apply", max_retries=20)
    async def apply(n: int, ctx: aqw.Context) -> None:
        nonlocal ran
        ran = True
        await asyncio.sleep(random.random() * 0.01)
        async with (
            pool.acquire() as conn,
            conn.transaction(),
            ctx.effect(conn, store) as first_time,
        ):
            if first_time:
                await conn.execute(
                    f"INSERT INTO {table} (job_id, n, fence) VALUES ($1, $2, $3)",
                    ctx.job_id,
                    n,
                    ctx.fencing_token,
                )

    # A worker that cannot reach the servers at its start gives up (exit 1), as `aqw worker`
    # does; under load a forming cluster can be that slow. Try again then, as a deployment
    # with `--wait-for-broker` would, but never after a job ran: a worker that gave up
    # mid-run is what the chaos tests look for.
    for _ in range(20):
        try:
            await app.worker(concurrency=20, grace=1.0).run()
            return
        except aqw.BrokerUnavailable:
            if ran:
                raise
            await asyncio.sleep(0.5)
    raise SystemExit("could not reach the broker at start, 20 times")


if __name__ == "__main__":
    asyncio.run(main())
