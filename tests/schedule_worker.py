"""A worker process for tests/test_schedule.py: ``python tests/schedule_worker.py QUEUE``.

Runs the periodic ``tick`` task (``aqw.Every(1, catch_up=10)``) on the real Redis
(AQW_TEST_REDIS_URL) until SIGTERM; the scheduler's INFO lines (``... leads queue ...``) go
to stderr, so the test can tell which process leads. Each job appends its idempotency key
to a ledger under the queue's hash tag.
"""

from __future__ import annotations

import logging
import sys

from _worker_script import REDIS_URL, ledger_key, run, serve
from redis.asyncio import Redis

import aqw


async def main(queue: str) -> None:
    ledger = Redis.from_url(REDIS_URL)
    app = aqw.App(REDIS_URL, queue=queue)

    @app.task(name="tick", schedule=aqw.Every(1, catch_up=10))
    async def tick(ctx: aqw.Context) -> None:
        await ledger.rpush(ledger_key(queue), ctx.job.key or "")  # type: ignore[misc]

    await serve(app, ledger, concurrency=4, grace=1.0)


if __name__ == "__main__":
    logging.getLogger("aqw.scheduler").setLevel(logging.INFO)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    logging.getLogger("aqw.scheduler").addHandler(handler)
    run(main(sys.argv[1]))
