"""Redis-specific behaviour without a Redis server: the Redis Streams broker on fakeredis.

Needs fakeredis with Lua (aqw's Redis broker runs scripts): pip install 'fakeredis[lua]'.
"""

import asyncio

import fakeredis

import aqw
from aqw.brokers.redis import RedisBroker

done: list[int] = []


def make_app(client: fakeredis.FakeAsyncRedis) -> aqw.App:
    app = aqw.App(RedisBroker(client, "reports"))  # the real Redis broker, on a fake server

    @app.task(name="build_report")
    async def build_report(report_id: int) -> None:
        done.append(report_id)

    return app


async def main() -> None:
    client = fakeredis.FakeAsyncRedis()
    app = make_app(client)
    build_report = app.get_task("build_report")

    first = await build_report.enqueue(7, key="report:7")
    again = await build_report.enqueue(7, key="report:7")  # same idempotency key: not written
    assert again.duplicate and again == first
    await build_report.enqueue(8, delay=60.0)
    assert (await app.broker.depth()).delayed == 1

    async with app.worker(burst=True) as worker:
        await worker.wait_stopped()
    assert done == [7] and worker.stats.processed == 1

    keys = sorted(k.decode() for k in await client.keys("aqw:{reports}:*"))
    print("keys on the fake server:", ", ".join(keys))
    await app.close()
    await client.aclose()


if __name__ == "__main__":
    asyncio.run(main())
