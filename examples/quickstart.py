"""Quickstart: enqueue a batch of jobs and process them with a worker, in one process.

Runs on the embedded in-process broker by default (no server needed)::

    python examples/quickstart.py            # 2,000 jobs on memory://
    python examples/quickstart.py --broker redis://127.0.0.1:6379/0 --jobs 20000
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import time

from pydantic import BaseModel

import aqw


class Resize(BaseModel):
    image_id: int
    width: int


def build_app(broker: str) -> tuple[aqw.App, aqw.Task[None]]:
    app = aqw.App(broker, queue="quickstart", retry=aqw.RetryPolicy(max_retries=3, base=0.01))

    @app.task(name="resize", lease_ttl=10.0, timeout=5.0)
    async def resize(data: Resize, ctx: aqw.Context) -> None:
        """Pretend to resize an image; one in fifty fails once and is retried."""
        await asyncio.sleep(random.uniform(0.001, 0.005))
        if data.image_id % 50 == 0 and ctx.attempt == 1:
            raise RuntimeError("transient storage error")

    return app, resize


async def main(broker: str, jobs: int, concurrency: int) -> int:
    app, resize = build_app(broker)
    started = time.perf_counter()
    await resize.enqueue_many([Resize(image_id=i, width=640) for i in range(jobs)])
    print(f"enqueued {jobs} jobs on {broker} in {time.perf_counter() - started:.2f}s")

    started = time.perf_counter()
    async with app.worker(concurrency=concurrency) as worker:
        while worker.stats.processed < jobs:
            elapsed = time.perf_counter() - started
            rate = worker.stats.processed / elapsed if elapsed else 0.0
            print(
                f"\rprocessed {worker.stats.processed}/{jobs}  {rate:,.0f} jobs/s  "
                f"retried {worker.stats.retried}",
                end="",
                flush=True,
            )
            await asyncio.sleep(0.1)
    elapsed = time.perf_counter() - started
    s = worker.stats
    print(f"\rprocessed {s.processed}/{jobs}" + " " * 30)
    print(f"done in {elapsed:.2f}s ({s.processed / elapsed:,.0f} jobs/s): {s.summary()}")
    depth = await app.broker.depth()
    await app.close()
    return 0 if s.processed == jobs and depth.waiting == depth.in_flight == 0 else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="memory://")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=100)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(asyncio.run(main(args.broker, args.jobs, args.concurrency)))
