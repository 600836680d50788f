"""A worker process for tests/test_batch_crash.py: ``python tests/batch_worker.py QUEUE``.

Runs batch children (``child``: 5-20 ms, then a ledger entry) and the batches' callback
(``done``: a ledger entry naming its batch and its own job id) on the real Redis
(AQW_TEST_REDIS_URL) until SIGTERM. Ledger keys live under the queue's hash tag."""

from __future__ import annotations

import asyncio
import random
import sys

from _worker_script import REDIS_URL, run, serve
from redis.asyncio import Redis

import aqw

LEASE_TTL = 1.0


def ledger_keys(queue: str) -> tuple[str, str]:
    """(the children's runs, the callbacks' runs)."""
    tag = f"aqw:{{{queue}}}"
    return f"{tag}:ledger:children", f"{tag}:ledger:callbacks"


def make_app(queue: str, ledger: Redis | None = None) -> aqw.App:
    app = aqw.App(REDIS_URL, queue=queue, lease_ttl=LEASE_TTL)
    children, callbacks = ledger_keys(queue)

    @app.task(name="child")
    async def child(n: int, ctx: aqw.Context) -> None:
        assert ledger is not None, "this app only enqueues"
        await asyncio.sleep(random.uniform(0.005, 0.02))
        await ledger.rpush(children, ctx.job_id)

    @app.task(name="done")
    async def done(ctx: aqw.Context) -> None:
        assert ledger is not None and ctx.batch is not None
        await ledger.rpush(callbacks, f"{ctx.batch.id} {ctx.job_id} {ctx.batch.succeeded}")

    return app


async def main(queue: str) -> None:
    ledger = Redis.from_url(REDIS_URL)
    await serve(make_app(queue, ledger), ledger, concurrency=8, grace=5.0)


if __name__ == "__main__":
    run(main(sys.argv[1]))
