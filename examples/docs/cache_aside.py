"""aqw.cache.Cache: cache-aside with single-flight loads, versioned entries, write-through
and invalidation, in front of a datastore that stays the source of truth.

Needs Redis: AQW_REDIS_URL (default redis://127.0.0.1:6379/0).
"""

import asyncio
import os
import uuid

from redis.asyncio import Redis

from aqw.cache import Cache

REDIS_URL = os.environ.get("AQW_REDIS_URL", "redis://127.0.0.1:6379/0")
db = {"customer:7": {"name": "Ada", "tier": "gold"}}  # stand-in for the real datastore
reads = 0


async def load_customer() -> dict[str, str]:
    global reads
    reads += 1
    await asyncio.sleep(0.05)  # a slow query
    return dict(db["customer:7"])


async def main() -> None:
    redis = Redis.from_url(REDIS_URL)
    prefix = f"docs-cache-{uuid.uuid4().hex[:8]}"
    cache = Cache(redis, prefix=prefix, default_ttl=60.0)
    try:
        # Cache-aside with single-flight: 20 concurrent misses cost one datastore read.
        values = await asyncio.gather(
            *(cache.get_or_load("customer:7", load_customer) for _ in range(20))
        )
        assert reads == 1 and all(v == {"name": "Ada", "tier": "gold"} for v in values)
        await cache.get_or_load("customer:7", load_customer)  # a hit
        print(f"hits={cache.hits} misses={cache.misses} datastore reads={reads}")

        # Write-through: write the datastore, bump the version, store the new value at it.
        db["customer:7"]["tier"] = "platinum"
        version = await cache.bump_version("customer:7")  # older entries are stale from now
        assert await cache.put_after_write("customer:7", db["customer:7"], version)
        # A slow writer that still holds the previous version cannot overwrite it.
        assert not await cache.put(
            "customer:7", {"name": "Ada", "tier": "gold"}, version=version - 1
        )
        entry = await cache.get("customer:7")
        print("after write-through:", entry.value, "version", entry.version)

        # Invalidation: delete and bump in one step; the next read loads again.
        await cache.invalidate("customer:7")
        assert not (await cache.get("customer:7")).hit
        assert (await cache.get_or_load("customer:7", load_customer))["tier"] == "platinum"
        assert reads == 2
    finally:
        keys = [k async for k in redis.scan_iter(match=f"{prefix}:*")]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()


if __name__ == "__main__":
    asyncio.run(main())
