"""Why a fencing token: a holder that paused past its lease must not overwrite newer work.

A lease alone cannot stop a holder that was paused (GC, a stalled VM, a slow network) and
wakes up after its lease expired and someone else took it: it still believes it holds the
lease. The datastore can stop it, if every write carries the lease's fencing token and the
store refuses a token lower than one it has already seen.

Needs Redis: AQW_REDIS_URL (default redis://127.0.0.1:6379/0).
"""

import asyncio
import os
import uuid

from redis.asyncio import Redis

import aqw

REDIS_URL = os.environ.get("AQW_REDIS_URL", "redis://127.0.0.1:6379/0")


class Store:
    """A datastore that keeps the highest fencing token per row and refuses older ones
    (in SQL: UPDATE ... WHERE fence <= $token; aqw.idempotency.SqlCompletionStore does this)."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, int]] = {}

    def write(self, row: str, value: str, fence: int) -> bool:
        current = self.rows.get(row)
        if current is not None and fence < current[1]:
            return False
        self.rows[row] = (value, fence)
        return True


async def main() -> None:
    redis = Redis.from_url(REDIS_URL)
    key = f"docs-fence-{uuid.uuid4().hex[:8]}:invoice:9"
    store = Store()
    try:
        # Holder A takes the lease, then "pauses" without renewing (no `async with`).
        a = aqw.Lease(redis, key, ttl=0.2)
        await a.acquire()
        await asyncio.sleep(0.3)  # A's lease has expired; A does not know yet

        # Holder B takes the expired lease: its token is higher.
        async with aqw.Lease(redis, key, ttl=5.0) as b:
            assert b.fencing_token > a.fencing_token
            assert store.write("invoice:9", "written by B", b.fencing_token)

            # A wakes up and writes: refused by the store, thanks to the token.
            assert not store.write("invoice:9", "written by A", a.fencing_token)
            # And A's release cannot delete B's key: release compares the token first.
            assert await a.release() is False

        print(f"A token {a.fencing_token}, B token {b.fencing_token}: row =", store.rows)
    finally:
        await redis.delete(key, f"{key}:fence")
        await redis.aclose()


if __name__ == "__main__":
    asyncio.run(main())
