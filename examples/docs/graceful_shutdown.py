"""Graceful shutdown: stop fetching, let running jobs finish within the grace period, then
cancel the rest and hand them back so another worker starts them at once."""

import asyncio
import logging

import aqw

logging.basicConfig(level=logging.CRITICAL)  # keep this demo's output short
app = aqw.App("memory://", queue="renders")
started = asyncio.Event()


@app.task
async def render(seconds: float, ctx: aqw.Context) -> None:
    started.set()
    await asyncio.sleep(seconds)


async def main() -> None:
    await render.enqueue(0.1)  # finishes within the grace period
    await render.enqueue(60.0)  # does not: cancelled and handed back

    first = app.worker(concurrency=2, grace=0.5)
    await first.start()
    await started.wait()
    await first.stop()  # what SIGTERM does to `aqw worker`
    print("first worker:", first.stats.processed, "finished,", first.stats.requeued, "handed back")
    assert (first.stats.processed, first.stats.requeued) == (1, 1)

    depth = await app.broker.depth()
    print("waiting again at once:", depth.waiting)  # not after a lease timeout
    assert depth.waiting == 1
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
