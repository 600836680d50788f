"""A worker process for tests/test_crash.py: ``python tests/crash_worker.py QUEUE [CONCURRENCY]``.

Runs the ``record`` task on the real Redis (AQW_TEST_REDIS_URL) until SIGTERM. Each job
sleeps 5-20 ms, then records its completion in a ledger in Redis, fenced: the write carries
the job lease's fencing token and is refused when a higher token was already recorded for
that job (a late write from a stale holder). Ledger keys live under the queue's hash tag, so
the test's cleanup removes them with the queue.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys

from _worker_script import REDIS_URL, run, serve
from redis.asyncio import Redis

import aqw

LEASE_TTL = 1.0

#: KEYS[1] ledger list, KEYS[2] hash job id -> highest fencing token recorded,
#: KEYS[3] counter of refused (stale) writes. ARGV[1] job id, ARGV[2] fencing token,
#: ARGV[3] worker pid. Returns 1 when recorded, 0 when refused.
LEDGER_WRITE = """
local top = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
local fence = tonumber(ARGV[2])
if fence < top then
  redis.call('INCR', KEYS[3])
  return 0
end
if fence > top then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
end
redis.call('RPUSH', KEYS[1], ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3])
return 1
"""


def ledger_keys(queue: str) -> list[str]:
    tag = f"aqw:{{{queue}}}"
    return [f"{tag}:ledger", f"{tag}:ledger:top", f"{tag}:ledger:refused"]


def make_app(queue: str, ledger: Redis | None = None) -> aqw.App:
    app = aqw.App(REDIS_URL, queue=queue, lease_ttl=LEASE_TTL)
    write = ledger.register_script(LEDGER_WRITE) if ledger is not None else None
    keys = ledger_keys(queue)

    @app.task(name="record")
    async def record(n: int, ctx: aqw.Context) -> None:
        assert write is not None, "this app only enqueues"
        await asyncio.sleep(random.uniform(0.005, 0.02))
        await write(keys=keys, args=[ctx.job_id, ctx.fencing_token, os.getpid()])

    return app


async def main(queue: str, concurrency: int) -> None:
    ledger = Redis.from_url(REDIS_URL)
    app = make_app(queue, ledger)
    await serve(app, ledger, concurrency=concurrency, grace=5.0)


if __name__ == "__main__":
    run(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 8))
