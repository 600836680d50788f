"""Quickstart: one task, a few jobs, a worker that stops when the queue is empty."""

import asyncio

from pydantic import BaseModel

import aqw

app = aqw.App("memory://", queue="signups")  # "redis://127.0.0.1:6379/0" for a real queue


class Signup(BaseModel):
    email: str
    plan: str = "free"


@app.task(max_retries=3, timeout=30.0)
async def send_welcome(data: Signup, ctx: aqw.Context) -> None:
    ctx.log.info("welcoming %s (attempt %d)", data.email, ctx.attempt)


async def main() -> None:
    for email in ["ada@example.com", "grace@example.com", "alan@example.com"]:
        job_id = await send_welcome.enqueue(Signup(email=email))
        print("enqueued", job_id)

    worker = app.worker(concurrency=10, burst=True)  # burst: stop once the queue is empty
    await worker.run()
    print(worker.stats)
    assert worker.stats.processed == 3
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
