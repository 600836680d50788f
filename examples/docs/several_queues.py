"""One worker on several queues: tasks routed by queue, served in strict order or by weight."""

import asyncio

import aqw

app = aqw.App("memory://", queue="default")
ran: list[str] = []


@app.task(queue="high")  # every job of this task goes to queue "high"
async def send_receipt(order_id: int) -> None:
    ran.append(f"high:{order_id}")


@app.task  # the app's queue, "default"
async def rebuild_index(shard: int) -> None:
    ran.append(f"default:{shard}")


@app.task(queue="low")
async def purge_cache(region: str) -> None:
    ran.append(f"low:{region}")


async def main() -> None:
    await rebuild_index.enqueue_many([1, 2])
    await purge_cache.enqueue("eu")
    await rebuild_index.enqueue(3, queue="high")  # one call may name another queue
    await send_receipt.enqueue_many([10, 11])

    # Strict order: a waiting job of an earlier queue is always taken first.
    async with app.worker(concurrency=1, queues=["high", "default", "low"], burst=True) as w:
        await w.wait_stopped()
    print(ran)
    assert ran == ["default:3", "high:10", "high:11", "default:1", "default:2", "low:eu"]

    # Weights: with every queue full, fetches are shared 5:3:1; an idle queue's share goes
    # to the others. Each queue keeps its own DLQ, delayed set, stats and records.
    ran.clear()
    await send_receipt.enqueue_many(list(range(45)))
    await rebuild_index.enqueue_many(list(range(27)))
    await purge_cache.enqueue_many(["eu", "us"] * 5)
    weights = {"high": 5, "default": 3, "low": 1}
    async with app.worker(concurrency=1, queues=weights, burst=True) as w:
        await w.wait_stopped()
    first = [name.split(":")[0] for name in ran[:18]]
    print({queue: first.count(queue) for queue in weights})  # about 10, 6 and 2
    assert first.count("high") > first.count("default") > first.count("low")
    print("low's depth:", await app.broker_for("low").depth())
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
