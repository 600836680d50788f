"""A worker process for tests/test_lease_pause.py: ``python tests/pause_worker.py QUEUE``.

Runs the ``steps`` task (lease_ttl=1 s, timeout 60 s) on the real Redis (AQW_TEST_REDIS_URL, default
db 0) until SIGTERM. The handler writes a ledger entry for every statement it runs: ``start``,
then ``STEPS`` times ``await asyncio.sleep(STEP)`` and a write of the step number, then
``done``. Each entry reads ``<fence> <event> <pid> <client time> <server time>``: the job
lease's fencing token, what was done, the writing process, ``time.time()`` when the statement
ran, and the Redis server's clock when the write landed (both on the same host, so both
compare with the test's ``time.time()``). The ledger lives under the queue's hash tag, so the
test's cleanup removes it with the queue.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from _worker_script import REDIS_URL, TIMED_LEDGER_WRITE, ledger_key, run, serve
from redis.asyncio import Redis

import aqw

LEASE_TTL = 1.0
STEPS = 30
STEP = 0.1


def parse(entry: bytes) -> tuple[int, str, int, float, float]:
    fence, event, pid, client, server = entry.decode().split()
    return int(fence), event, int(pid), float(client), float(server)


def register(app: aqw.App, ledger: Redis | None) -> None:
    """Register ``steps`` on ``app``, writing its ledger through ``ledger``."""
    write = ledger.register_script(TIMED_LEDGER_WRITE) if ledger is not None else None
    key = ledger_key(app.queue)

    @app.task(name="steps", lease_ttl=LEASE_TTL, timeout=60.0, max_retries=3)
    async def steps(n: int, ctx: aqw.Context) -> None:
        assert write is not None, "this app only enqueues"
        fence, pid = ctx.fencing_token, os.getpid()
        await write(keys=[key], args=[f"{fence} start {pid} {time.time()!r}"])
        for i in range(STEPS):
            await asyncio.sleep(STEP)
            await write(keys=[key], args=[f"{fence} {i} {pid} {time.time()!r}"])
        await write(keys=[key], args=[f"{fence} done {pid} {time.time()!r}"])


async def main(queue: str) -> None:
    ledger = Redis.from_url(REDIS_URL)
    app = aqw.App(REDIS_URL, queue=queue)
    register(app, ledger)
    await serve(app, ledger, concurrency=4, grace=2.0)


if __name__ == "__main__":
    run(main(sys.argv[1]))
