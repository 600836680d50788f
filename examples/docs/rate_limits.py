"""Flow control: a rate limit shared by every worker, one bucket per key, a per-key
concurrency cap, and a handler that meets an upstream's 429."""

import asyncio
import time

from pydantic import BaseModel

import aqw

app = aqw.App("memory://", queue="flow")


class Sync(BaseModel):
    customer_id: str
    n: int = 0


@app.task(rate_limit="20/s")  # starts at least 50 ms apart, whatever the number of workers
async def ping(n: int) -> None: ...


@app.task(rate_limit="10/s", rate_key=lambda p: p.customer_id)  # a bucket per customer
async def sync_customer(data: Sync) -> None: ...


running: dict[str, int] = {}
most: dict[str, int] = {}


@app.task(concurrency_key=lambda p: p.customer_id, max_per_key=1)  # one at a time per key
async def export(data: Sync) -> None:
    running[data.customer_id] = running.get(data.customer_id, 0) + 1
    most[data.customer_id] = max(most.get(data.customer_id, 0), running[data.customer_id])
    await asyncio.sleep(0.02)
    running[data.customer_id] -= 1


calls: list[int] = []


@app.task(max_retries=0)  # no retry budget: a deferral spends none
async def call_api(ctx: aqw.Context) -> None:
    calls.append(ctx.attempt)
    if len(calls) == 1:
        raise aqw.RateLimited(0.05)  # "429, Retry-After: 0.05": run again later


async def main() -> None:
    began = time.monotonic()
    await ping.enqueue_many(list(range(10)))
    await sync_customer.enqueue_many([Sync(customer_id=c) for c in ("a", "b")])
    await export.enqueue_many([Sync(customer_id=c, n=n) for n in range(3) for c in ("a", "b")])
    await call_api.enqueue()

    worker = app.worker(concurrency=16, burst=True)
    await worker.run()
    took = time.monotonic() - began

    print(f"10 pings at 20/s took {took:.2f}s; jobs put off: {worker.stats.deferred}")
    print("most exports at once per customer:", most)
    print("call_api attempts:", calls)
    assert took >= 9 * 0.05
    assert most == {"a": 1, "b": 1}
    assert calls == [1, 1]  # the same attempt, run twice
    assert worker.stats.processed == 10 + 2 + 6 + 1
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
