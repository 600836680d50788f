"""The Redis Streams broker, seen from Redis: where jobs wait, and that settled jobs leave.

Needs Redis: AQW_REDIS_URL (default redis://127.0.0.1:6379/0).
"""

import asyncio
import os
import uuid

from redis.asyncio import Redis

import aqw

REDIS_URL = os.environ.get("AQW_REDIS_URL", "redis://127.0.0.1:6379/0")
QUEUE = f"docs-{uuid.uuid4().hex[:8]}"
app = aqw.App(REDIS_URL, queue=QUEUE)


@app.task
async def thumbnail(image_id: int) -> None:
    await asyncio.sleep(0.01)


async def main() -> None:
    redis = Redis.from_url(REDIS_URL, decode_responses=True)
    tag = f"aqw:{{{QUEUE}}}"  # every key of the queue shares this hash tag
    try:
        await thumbnail.enqueue_many([1, 2, 3])  # XADD to the stream, one round trip
        await thumbnail.enqueue(4, delay=3600)  # ZADD to the delayed set, due in an hour
        print(
            "stream",
            await redis.xlen(f"{tag}:stream"),
            "delayed",
            await redis.zcard(f"{tag}:delayed"),
        )

        worker = app.worker(concurrency=8, burst=True)
        await worker.run()
        assert worker.stats.processed == 3

        # Settled entries are deleted: the stream holds exactly the unfinished work.
        assert await redis.xlen(f"{tag}:stream") == 0
        print(
            "after the worker: stream",
            await redis.xlen(f"{tag}:stream"),
            "| stats",
            await redis.hgetall(f"{tag}:stats"),
            "| depth",
            (await app.broker.depth()).as_dict(),
        )
        print("keys:", sorted([k.split(":", 2)[2] async for k in redis.scan_iter(f"{tag}:*")]))
    finally:
        keys = [k async for k in redis.scan_iter(match=f"{tag}:*")]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()
        await app.close()


if __name__ == "__main__":
    asyncio.run(main())
