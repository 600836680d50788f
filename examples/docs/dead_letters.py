"""The dead-letter queue: what lands there, and how to list, replay and purge it."""

import asyncio
import logging

from pydantic import BaseModel

import aqw

logging.basicConfig(level=logging.CRITICAL)  # keep this demo's output short
app = aqw.App("memory://", queue="imports", retry=aqw.RetryPolicy(max_retries=2, base=0.01))


class Row(BaseModel):
    sku: str
    qty: int


@app.task
async def import_row(row: Row) -> None:
    if row.qty < 0:
        raise ValueError(f"negative quantity for {row.sku}")


async def main() -> None:
    await import_row.enqueue(Row(sku="A-1", qty=-5))  # fails 3 times: dead-lettered
    await app.broker.publish_raw(b"\xff not json")  # malformed: dead-lettered, never dropped
    await app.broker.publish([aqw.Job(task="import_rows_v0", payload={})])  # unknown task
    await app.broker.publish([aqw.Job(task="import_row", payload={"sku": "B"})])  # invalid
    await app.worker(burst=True).run()

    for dead in await app.dlq.list():
        print(
            f"{dead.id:<18} {dead.task or '(undecodable)':<15} {dead.error_type:<16} "
            f"attempts={dead.attempts} {dead.error[:50]}"
        )
    assert await app.dlq.count() == 4

    # Fix the data and replay the failed import: back on the queue, attempt count reset.
    first = (await app.dlq.list(task="import_row", error_type="ValueError"))[0]
    replayed = await app.dlq.replay([first.id], edit_payload=Row(sku="A-1", qty=5))
    worker = app.worker(burst=True)
    await worker.run()
    assert replayed == 1 and worker.stats.processed == 1

    purged = await app.dlq.purge(older_than=0)  # every dead job that failed before now
    print(f"replayed {replayed}, purged {purged}, left {await app.dlq.count()}")
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
