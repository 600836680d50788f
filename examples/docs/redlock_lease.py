"""A lease held on a majority of independent Redis servers (Redlock).

The lease survives the loss of a minority of the servers. For this demo the three
"servers" are three databases of one Redis (AQW_REDIS_URL's host, databases 0-2); in
production give three independent servers that are not replicas of each other.
"""

import asyncio
import os
import uuid
from urllib.parse import urlsplit, urlunsplit

import aqw
from aqw.lease.redlock import RedlockBackend

REDIS_URL = os.environ.get("AQW_REDIS_URL", "redis://127.0.0.1:6379/0")
URLS = [urlunsplit(urlsplit(REDIS_URL)._replace(path=f"/{db}")) for db in (0, 1, 2)]


async def main() -> None:
    key = f"docs-redlock-{uuid.uuid4().hex[:8]}:customer:7"
    # per_node_timeout: how long each server has to answer before it counts as a refusal. The
    # default (50 ms) suits servers on a quiet network; on a busy machine give them longer
    # (it must stay well below the ttl: the lease is valid for ttl minus the time it took).
    async with RedlockBackend.from_urls(URLS, per_node_timeout=0.5) as backend:
        try:
            print("quorum", backend.quorum, "of", len(backend.clients))
            async with aqw.Lease(backend, key, ttl=2.0) as first:
                held = [await c.get(key) is not None for c in backend.clients]
                print("held on", sum(held), "servers, fencing token", first.fencing_token)
                try:
                    async with aqw.Lease(backend, key, ttl=2.0):
                        raise AssertionError("two holders")
                except aqw.LeaseUnavailable:
                    print("a second holder is refused")
            async with aqw.Lease(backend, key, ttl=2.0) as second:
                assert second.fencing_token > first.fencing_token  # tokens keep growing
        finally:
            for client in backend.clients:
                await client.delete(key, f"{key}:fence")


if __name__ == "__main__":
    asyncio.run(main())
