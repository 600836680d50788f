"""Cancel a job that waits (it never runs), one that runs (its handler is stopped at the
next lease renewal), and let another expire before it starts."""

import asyncio

import aqw

app = aqw.App("memory://", queue="mail", lease_ttl=3.0)  # renewals (and cancel checks) every 1 s
started = asyncio.Event()


@app.task
async def send_digest(user: str, ctx: aqw.Context) -> None:
    started.set()
    try:
        for _ in range(600):
            await asyncio.sleep(0.1)  # stand-in for real work
    except asyncio.CancelledError:
        print("handler stopped; ctx.cancelled =", ctx.cancelled)  # True
        raise


async def main() -> None:
    waiting = await send_digest.enqueue("ann", delay=30)
    print("waiting job:", await app.cancel(waiting))  # cancelled: it will never run

    expiring = await send_digest.enqueue("bob", delay=0.2, expires=0.1)  # due after it expires

    running = await send_digest.enqueue("cid")
    async with app.worker(concurrency=4):
        await started.wait()
        print("running job:", await app.cancel(running))  # cancelling
        try:
            await app.result(running, timeout=10)
        except aqw.JobCancelled:
            print("it ended cancelled")
        await asyncio.sleep(0.5)

    for job_id in (waiting, expiring, running):
        info = await app.job(job_id)
        assert info is not None
        print(job_id, info.state)  # cancelled, expired, cancelled
    print("again:", await app.cancel(running))  # finished: nothing to cancel
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
