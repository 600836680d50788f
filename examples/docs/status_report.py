"""The `aqw status` screen from Python: depth from the broker, rates, workers, stuck jobs
and top errors from the workers' heartbeats, alerts from the active monitor."""

import asyncio
import json
import logging

import aqw
from aqw.status import gather_status, render

logging.basicConfig(level=logging.CRITICAL)  # keep this demo's output short
app = aqw.App("memory://", queue="emails", retry=aqw.RetryPolicy(base=0.01))


@app.task
async def deliver(n: int, ctx: aqw.Context) -> None:
    if n % 4 == 0 and ctx.attempt == 1:
        raise TimeoutError("SMTP server did not answer")


async def main() -> None:
    await deliver.enqueue_many(range(20))
    async with aqw.Worker(app, concurrency=8, heartbeat=0.2) as worker:
        for _ in range(100):  # up to 5 s for the 20 jobs
            if worker.stats.processed == 20:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # let a heartbeat carry the final counts
        status = await gather_status(app)
    print(render(status))
    print(json.dumps(status["last_5m"]))  # `aqw status --json` prints the whole dict
    assert status["last_5m"]["processed"] == 20
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
