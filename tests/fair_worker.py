"""A worker process for tests/test_fairness.py: ``python tests/fair_worker.py QUEUE``.

The task ``tenant_job`` (``fairness_key`` = the payload's ``tenant``, ``fairness_weight`` its
``w``, 1 without) appends
``"<tenant> <n> <pid>"`` to the ledger as it starts, then sleeps 5 ms. Concurrency 2, no
prefetch: a worker holds at most 2 jobs it fetched. Runs on the real Redis
(AQW_TEST_REDIS_URL) until SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from _worker_script import REDIS_URL, ledger_key, run, serve
from redis.asyncio import Redis

import aqw


async def main(queue: str) -> None:
    ledger = Redis.from_url(REDIS_URL)
    app = aqw.App(REDIS_URL, queue=queue)
    key = ledger_key(queue)

    @app.task(
        name="tenant_job",
        fairness_key=lambda p: p["tenant"],
        fairness_weight=lambda p: p.get("w", 1),
    )
    async def tenant_job(p: dict[str, Any]) -> None:
        await ledger.rpush(key, f"{p['tenant']} {p['n']} {os.getpid()}")  # type: ignore[misc]
        await asyncio.sleep(0.005)

    await serve(app, ledger, concurrency=2, grace=2.0)


if __name__ == "__main__":
    run(main(sys.argv[1]))
