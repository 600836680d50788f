"""Idempotency keys: one job per key, and a finished keyed job never runs twice."""

import asyncio

import aqw

app = aqw.App("memory://", queue="orders", idempotency_ttl=3600.0)
charged: list[int] = []


@app.task
async def charge(order_id: int) -> None:
    charged.append(order_id)


async def main() -> None:
    first = await charge.enqueue(42, key="charge:42")
    again = await charge.enqueue(42, key="charge:42")  # e.g. the client retried its request
    print(first, first.duplicate, "|", again, again.duplicate)
    assert again == first and again.duplicate  # nothing new was written

    await app.worker(burst=True).run()
    assert charged == [42]

    # The broker delivers a copy of the finished job (at-least-once delivery does this):
    # the job's completion record makes the worker acknowledge it without running it.
    await app.broker.publish([aqw.Job(task="charge", payload=42, key="charge:42")])
    worker = app.worker(burst=True)
    await worker.run()
    print("duplicates skipped:", worker.stats.duplicates_skipped)
    assert charged == [42] and worker.stats.duplicates_skipped == 1
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
