"""Testing tasks on the memory broker: enqueue, run a burst worker, assert, and call a
handler directly. No server: memory:// keeps the queue inside the test's process."""

import asyncio
import logging

from pydantic import BaseModel

import aqw

logging.basicConfig(level=logging.CRITICAL)  # the failing job below logs its retries
app = aqw.App("memory://", queue="orders", retry=aqw.RetryPolicy(max_retries=1, base=0.01))
shipped: list[str] = []


class Order(BaseModel):
    order_id: str
    qty: int


@app.task
async def ship(order: Order) -> str:
    if order.qty <= 0:
        raise ValueError(f"order {order.order_id}: nothing to ship")
    shipped.append(order.order_id)
    return f"shipped {order.order_id}"


async def test_a_handler_called_directly() -> None:
    # Calling a task runs its handler here: no queue, no lease, no retries.
    assert await ship(Order(order_id="o-1", qty=2)) == "shipped o-1"


async def test_the_whole_path_with_a_burst_worker() -> None:
    await ship.enqueue(Order(order_id="o-2", qty=1))
    await ship.enqueue(Order(order_id="o-3", qty=0))  # fails twice: dead-lettered
    async with app.worker(burst=True) as worker:  # burst: stops once the queue is empty
        await worker.wait_stopped()

    assert "o-2" in shipped
    assert worker.stats.processed == 1
    (dead,) = await app.dlq.list()  # what ended in the dead-letter queue, and why
    assert (dead.task, dead.error_type, dead.attempts) == ("ship", "ValueError", 2)
    assert dead.job is not None and dead.job.payload == {"order_id": "o-3", "qty": 0}
    assert (await app.broker.depth()).waiting == 0


async def main() -> None:
    await test_a_handler_called_directly()
    await test_the_whole_path_with_a_burst_worker()
    await app.close()
    print("ok:", shipped)


if __name__ == "__main__":
    asyncio.run(main())
