"""A lease on its own: exclusive, renewed in the background, fenced, and lost loudly.

Needs Redis: AQW_REDIS_URL (default redis://127.0.0.1:6379/0).
"""

import asyncio
import os
import uuid

from redis.asyncio import Redis

import aqw

REDIS_URL = os.environ.get("AQW_REDIS_URL", "redis://127.0.0.1:6379/0")


async def main() -> None:
    redis = Redis.from_url(REDIS_URL)
    key = f"docs-lease-{uuid.uuid4().hex[:8]}:report:7"
    try:
        # Held: renewed every ttl/3 while the block runs, released on exit.
        async with aqw.Lease(redis, key, ttl=0.6) as lease:
            print("fencing token", lease.fencing_token)
            try:  # a second holder fails fast (wait=None) or after `wait` seconds
                async with aqw.Lease(redis, key, ttl=0.6):
                    raise AssertionError("two holders")
            except aqw.LeaseUnavailable as exc:
                print("second holder refused:", exc)
            await asyncio.sleep(1.0)  # longer than the ttl: renewals keep it
            print("renewals so far", lease.renewals)
            assert lease.renewals >= 2
        assert await redis.get(key) is None  # released

        # Lost: someone deletes the key; the next renewal is refused, the block is
        # cancelled where it awaits and LeaseLost comes out of the `async with`.
        try:
            async with aqw.Lease(redis, key, ttl=0.6) as lease:
                await redis.delete(key)
                await asyncio.sleep(10)  # cancelled after ~0.2 s
        except aqw.LeaseLost as exc:
            print("lost:", exc.reason)
        else:
            raise AssertionError("the lease should have been lost")
    finally:
        await redis.delete(key, f"{key}:fence")
        await redis.aclose()


if __name__ == "__main__":
    asyncio.run(main())
