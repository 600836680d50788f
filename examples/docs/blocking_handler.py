"""A handler with blocking work: run it in a thread so the event loop (and the lease
renewals it runs) keeps going. ``time.sleep`` or a CPU-bound loop called directly in an
``async def`` handler would freeze every job of the worker for that long."""

import asyncio
import hashlib
import time

import aqw

app = aqw.App("memory://", queue="thumbnails")
digests: list[str] = []


def render(image_id: int) -> str:  # blocking: a C library, file I/O, a CPU-bound loop
    time.sleep(0.05)
    return hashlib.sha256(str(image_id).encode()).hexdigest()[:12]


@app.task(lease_ttl=10.0)
async def thumbnail(image_id: int) -> None:
    # Not: digests.append(render(image_id)), which blocks the loop for the whole render.
    digests.append(await asyncio.to_thread(render, image_id))


async def main() -> None:
    for image_id in range(8):
        await thumbnail.enqueue(image_id)
    started = time.monotonic()
    async with app.worker(concurrency=8, burst=True) as worker:
        await worker.wait_stopped()
    assert worker.stats.processed == 8 and len(digests) == 8
    print(f"8 thumbnails in {time.monotonic() - started:.2f}s, rendered in threads")
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
