"""A partitioned queue: one queue over several streams, each in a hash slot of its own.

Needs Redis: AQW_REDIS_URL (default redis://127.0.0.1:6379/0).
"""

import asyncio
import os
import uuid

from pydantic import BaseModel
from redis.asyncio import Redis

import aqw

REDIS_URL = os.environ.get("AQW_REDIS_URL", "redis://127.0.0.1:6379/0")
QUEUE = f"docs-{uuid.uuid4().hex[:8]}"
# Also as a URL: f"{REDIS_URL}?queue={QUEUE}&partitions=3" (the CLI and AQW_BROKER too).
app = aqw.App(REDIS_URL, queue=QUEUE, partitions=3)


class Charge(BaseModel):
    account: str
    cents: int


@app.task
async def thumbnail(image_id: int) -> None:
    await asyncio.sleep(0.01)


@app.task(concurrency_key=lambda c: c.account, max_per_key=1)
async def charge(c: Charge) -> None:
    await asyncio.sleep(0.01)  # one charge per account at a time, on every partition


async def main() -> None:
    redis = Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        ids = await thumbnail.enqueue_many(list(range(6)))  # dealt in turn
        print("job ids name their partition:", [i[-3:] for i in ids])
        accounts = [await charge.enqueue(Charge(account="acme", cents=n)) for n in (1, 2, 3)]
        assert len({i[-3:] for i in accounts}) == 1  # one account, one partition
        for p in range(3):
            stream = f"aqw:{{{QUEUE}:{p}}}:stream"  # each partition: its own hash tag
            print(stream, await redis.xlen(stream))
        print("depth over every partition:", await app.broker.depth())

        await app.worker(concurrency=8, burst=True).run()
        info = await app.job(ids[0])
        assert info is not None and info.state == "succeeded"
        print(ids[0], info.state)
    finally:
        for p in range(3):  # a sample cleans up after itself
            keys = [k async for k in redis.scan_iter(match=f"aqw:{{{QUEUE}:{p}}}:*")]
            if keys:
                await redis.delete(*keys)
        await redis.aclose()
        await app.close()


if __name__ == "__main__":
    asyncio.run(main())
