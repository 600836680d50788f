"""Priority levels and flow limits on the NATS JetStream broker: a stopped queue drains its
highest level first, and a per-key cap holds across two workers (each with its own
connection, as two processes would be).

Set AQW_NATS_URL to a JetStream server (default nats://127.0.0.1:4222). The queue's streams
and buckets are created on connect and deleted at the end.
"""

import asyncio
import os
import uuid

import nats

import aqw

URL = os.environ.get("AQW_NATS_URL", "nats://127.0.0.1:4222")
QUEUE = f"docs-{uuid.uuid4().hex[:8]}"

app = aqw.App(f"{URL}?queue={QUEUE}")
ran: list[str] = []
running: dict[str, int] = {}
most: dict[str, int] = {}


@app.task
async def send(kind: str) -> None:
    ran.append(kind)


@app.task(concurrency_key=lambda p: p["tenant"], max_per_key=1)
async def export(p: dict[str, str]) -> None:
    tenant = p["tenant"]
    running[tenant] = running.get(tenant, 0) + 1
    most[tenant] = max(most.get(tenant, 0), running[tenant])
    await asyncio.sleep(0.05)
    running[tenant] -= 1


async def main() -> None:
    other = aqw.App(f"{URL}?queue={QUEUE}")  # a second worker, on its own connection
    other.task(concurrency_key=lambda p: p["tenant"], max_per_key=1, name=export.name)(export.fn)
    try:
        await send.enqueue("newsletter")  # level 0
        await send.enqueue("receipt", priority=5)
        await send.enqueue("password reset", priority=9)
        await app.worker(concurrency=1, burst=True).run()
        print("ran:", ran)
        assert ran == ["password reset", "receipt", "newsletter"], ran

        await export.enqueue_many([{"tenant": t} for t in "aabbb"])
        w1, w2 = app.worker(concurrency=4, burst=True), other.worker(concurrency=4, burst=True)
        await asyncio.gather(w1.run(), w2.run())
        print("most exports of one tenant at once:", most)
        assert most == {"a": 1, "b": 1}, most
        print("put off by the cap:", w1.stats.deferred + w2.stats.deferred > 0)
    finally:
        await other.close()
        await app.close()
        nc = await nats.connect(URL)
        js = nc.jetstream()
        for stream in ("", "_DELAYED", "_DLQ"):
            await js.delete_stream(f"AQW_{QUEUE}{stream}")
        for bucket in ("LEASES", "KEYS", "STATE", "RECORDS", "DEPTH"):
            await js.delete_key_value(f"AQW_{QUEUE}_{bucket}")
        await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
