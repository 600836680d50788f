"""A worker process for tests/test_recovery.py: ``python tests/recovery_worker.py QUEUE [N]``.

Runs on the real Redis (AQW_TEST_REDIS_URL) with ``App()`` at its default lease_ttl (30 s)
and concurrency N (default 1) until SIGTERM. Two tasks, each ``hold`` seconds long, writing a
ledger entry when they start and when they end:

- ``short``: lease_ttl=2 s (crash recovery must follow this, not the app's 30 s);
- ``long``: lease_ttl=60 s (a live job that must never be reclaimed while it runs).

Entries read ``<task> <event> <fence> <attempt> <pid> <server time>``; the ledger lives under
the queue's hash tag, so the test's cleanup removes it with the queue.
"""

from __future__ import annotations

import asyncio
import os
import sys

from _worker_script import REDIS_URL, TIMED_LEDGER_WRITE, ledger_key, run, serve
from redis.asyncio import Redis

import aqw

SHORT_TTL = 2.0
LONG_TTL = 60.0


def parse(entry: bytes) -> tuple[str, str, int, int, int, float]:
    task, event, fence, attempt, pid, at = entry.decode().split()
    return task, event, int(fence), int(attempt), int(pid), float(at)


def make_app(queue: str, ledger: Redis | None = None) -> aqw.App:
    app = aqw.App(REDIS_URL, queue=queue)  # the default lease_ttl: 30 s
    write = ledger.register_script(TIMED_LEDGER_WRITE) if ledger is not None else None
    key = ledger_key(queue)

    async def run(name: str, hold: float, ctx: aqw.Context) -> None:
        assert write is not None, "this app only enqueues"
        tail = f"{ctx.fencing_token} {ctx.attempt} {os.getpid()}"
        await write(keys=[key], args=[f"{name} start {tail}"])
        await asyncio.sleep(hold)
        await write(keys=[key], args=[f"{name} end {tail}"])

    @app.task(name="short", lease_ttl=SHORT_TTL)
    async def short(hold: float, ctx: aqw.Context) -> None:
        await run("short", hold, ctx)

    @app.task(name="long", lease_ttl=LONG_TTL)
    async def long(hold: float, ctx: aqw.Context) -> None:
        await run("long", hold, ctx)

    return app


async def main(queue: str, concurrency: int) -> None:
    ledger = Redis.from_url(REDIS_URL)
    app = make_app(queue, ledger)
    await serve(app, ledger, concurrency=concurrency, grace=15.0)


if __name__ == "__main__":
    run(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1))
