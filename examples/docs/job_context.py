"""What a handler knows about its job (ctx), and how to watch a running job from outside."""

import asyncio

import aqw

app = aqw.App("memory://", queue="reports")
release = asyncio.Event()
finished = asyncio.Event()


@app.task(lease_ttl=10.0, sla=60.0)
async def build_report(report_id: int, ctx: aqw.Context) -> None:
    print(
        f"job {ctx.job_id}: task={ctx.task} attempt={ctx.attempt} fencing_token={ctx.fencing_token}"
    )
    await ctx.progress(0.5, "half way")
    await release.wait()  # stand-in for real work
    finished.set()


async def main() -> None:
    async with app.worker(concurrency=4):  # runs in the background of this block
        job_id = await build_report.enqueue(7)
        state = None
        while state is None or state["progress"] != "0.5":
            await asyncio.sleep(0.05)
            state = await app.job_status(job_id)
        print("running:", {k: state[k] for k in ("task", "attempt", "progress", "message")})
        release.set()
        await finished.wait()
    print("finished; state now:", await app.job_status(job_id))  # None: not running
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
