"""A worker process for tests/test_rate_limits.py and tests/test_concurrency_caps.py:
``python tests/limits_worker.py QUEUE rate|cap``.

``rate``: the task ``limited`` (``rate_limit="50/s"``, payload an int) appends
``{"n", "id", "attempt", "pid"}`` to the ledger. ``cap``: the task ``capped``
(``concurrency_key`` = the payload's ``key``, ``max_per_key=1``) sleeps 0.1 s and appends
``{"key", "n", "start", "end", "pid"}``, its start and end read from the Redis server's clock.
Runs on the real Redis (AQW_TEST_REDIS_URL) until SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from _worker_script import REDIS_URL, ledger_key, run, serve
from redis.asyncio import Redis

import aqw


async def server_time(client: Redis) -> float:
    seconds, micros = await client.time()
    return float(seconds) + micros / 1e6


async def main(queue: str, mode: str) -> None:
    ledger = Redis.from_url(REDIS_URL)
    app = aqw.App(REDIS_URL, queue=queue)
    key = ledger_key(queue)

    async def write(entry: dict[str, Any]) -> None:
        await ledger.rpush(key, json.dumps({**entry, "pid": os.getpid()}))  # type: ignore[misc]

    @app.task(name="limited", rate_limit="50/s")
    async def limited(n: int, ctx: aqw.Context) -> None:
        await write({"n": n, "id": ctx.job.id, "attempt": ctx.job.attempt})

    @app.task(name="capped", concurrency_key=lambda p: p["key"], max_per_key=1)
    async def capped(p: dict[str, Any]) -> None:
        start = await server_time(ledger)
        await asyncio.sleep(0.1)
        end = await server_time(ledger)
        await write({"key": p["key"], "n": p["n"], "start": start, "end": end})

    await serve(app, ledger, concurrency=8 if mode == "cap" else 10, grace=2.0)


if __name__ == "__main__":
    run(main(sys.argv[1], sys.argv[2]))
